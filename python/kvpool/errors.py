"""The client's exceptions. Expected outcomes (a miss, "already exists", "pool full") are values."""


class KvPoolError(Exception):
    """A request failed as a whole: a server error status, a broken connection, a timeout."""


class MasterUnreachable(KvPoolError):
    """The master could not be reached; the message names its address."""


class MasterTimeout(MasterUnreachable):
    """The master did not answer within the client's timeout (the message names it and the timeout)."""


class AuthenticationError(KvPoolError):
    """A connection's authentication failed: the server refused this process's proof, or the server
    could not prove it knows the cluster secret. The message names the peer, never a secret."""
