"""Scale-out: many processes on one engine directory or PostgreSQL namespace.

Above the engine, which holds one log and knows nothing of other processes.
One process owns the directory (it holds the directory's lease, an epoch, and
runs the engine as a single process would, serving the others: ``owner``);
every other ``Engine.open`` of it is a *follower* that routes each call to
the owner (``follower``) over a socket the owner serves (``server``,
``wire``) and takes over when the owner dies (``lease``, ``places``).
``placement`` is the choice ``Engine.open`` makes between the two. See
docs/scale-out.md.
"""
