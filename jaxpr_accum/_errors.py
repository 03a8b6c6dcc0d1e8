"""The library's own exception, in a leaf module that every other module may import."""


class SerializeError(ValueError):
    """The program cannot be serialized along the requested axis (reason in the message)."""


class ArgumentError(ValueError):
    """A bad argument of the user's, found once the call's arguments are known (a
    ``ValueError``): reported as it is, never a reason to fall back to a narrower plan."""
