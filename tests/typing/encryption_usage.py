"""Payload codecs as users type them (checked with ``mypy --strict``)."""

from __future__ import annotations

import fusee


class Rot(fusee.Codec):
    def encode(self, data: bytes) -> bytes:
        return b"R" + data

    def decode(self, data: bytes) -> bytes:
        return data[1:]


class Duck:
    def encode(self, data: bytes) -> bytes:
        return data

    def decode(self, data: bytes) -> bytes:
        return data


async def open_encrypted(key: bytes) -> None:
    aes = fusee.AesGcmCodec(keys={"k2": key, "k1": fusee.AesGcmCodec.generate_key()}, current="k2")
    for codec in (aes, Rot(), Duck()):
        async with fusee.Engine.open("./data", codec=codec):
            pass
    try:
        await fusee.Engine.open("./data", codec=aes)
    except fusee.MissingKey as e:
        key_id: str = e.key_id
        del key_id
    except fusee.DecryptionFailed as e:
        maybe: str | None = e.key_id
        del maybe
    fusee.Engine.open("./data", codec=object())  # type: ignore[arg-type]
