package io.kvpool.protocol;

/**
 * A well-formed request whose contents are invalid: a key over the size limit, an offset outside the
 * segment, an unknown segment id. Servers reply with {@link FrameStatus#BAD_REQUEST} and this message;
 * the message names the key, segment or field involved.
 */
public final class BadRequestException extends RuntimeException {

    public BadRequestException(String message) {
        super(message);
    }
}
