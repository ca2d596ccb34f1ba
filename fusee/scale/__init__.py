"""Scale-out: many processes on one engine directory.

One process owns the directory (it holds the directory's lease, an epoch, and
runs the engine as a single process would); every other ``Engine.open`` of it
is a *follower* that routes each call to the owner (``follower``) over a
socket the owner serves (``server``, ``wire``) and takes over when the owner
dies (``lease``). See docs/scale-out.md.
"""
