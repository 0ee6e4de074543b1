package io.kvpool.protocol;

import java.io.IOException;

/**
 * Serves requests for a {@link FrameServer}. Called on the connection's own virtual thread, one
 * request at a time per connection and concurrently across connections.
 *
 * <p>Throw {@link BadRequestException} for a request whose contents are invalid (the server replies
 * {@link FrameStatus#BAD_REQUEST}), {@link MalformedFrameException} for one that breaks the protocol
 * (the server replies and closes the connection). Any other exception is a bug: the server logs it,
 * replies {@link FrameStatus#INTERNAL_ERROR} and keeps serving other connections.
 */
@FunctionalInterface
public interface RequestHandler {

    void handle(Request request) throws IOException;

    /** Called when a connection closes, for handlers that track per-connection state. */
    default void connectionClosed(String peer) {
    }
}
