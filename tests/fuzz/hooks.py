"""Schemathesis hooks for Cella's API fuzzing (loaded through SCHEMATHESIS_HOOKS)."""

import schemathesis


@schemathesis.serializer("application/x-tar", "application/octet-stream")
def raw_bytes(ctx, value):
    # Image imports and file uploads take raw bytes: send whatever was generated, as bytes, so
    # the server sees arbitrary (mostly broken) archives and files.
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    return str(value).encode()
