package io.kvpool.protocol;

import java.io.IOException;

/**
 * A connection's authentication failed (version 8, docs/protocol.md section 4.31): the server refused
 * the proof, or the server could not prove it knows the cluster secret. The message names the peer
 * and what to check; it never contains a secret.
 */
public final class AuthenticationException extends IOException {
    public AuthenticationException(String message) {
        super(message);
    }
}
