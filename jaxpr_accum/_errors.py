"""The library's own exception, in a leaf module that every other module may import."""


class SerializeError(ValueError):
    """The program cannot be serialized along the requested axis (reason in the message)."""
