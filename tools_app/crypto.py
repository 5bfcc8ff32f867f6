"""Symmetric keys derived from ALEPH_SECRET_KEY, one per purpose."""

import nacl.hash
from django.conf import settings
from nacl.encoding import RawEncoder
from nacl.secret import SecretBox


def secret_box(purpose: bytes) -> SecretBox:
    """A SecretBox whose key is BLAKE2b(secret key) personalised by purpose (at most 16 bytes)."""
    key = nacl.hash.blake2b(
        settings.SECRET_KEY.encode(), digest_size=SecretBox.KEY_SIZE, person=purpose, encoder=RawEncoder
    )
    return SecretBox(key)
