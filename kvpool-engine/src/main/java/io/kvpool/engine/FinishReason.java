package io.kvpool.engine;

/** Why a request ended; {@link #wireName()} is the OpenAI-style {@code finish_reason} string. */
public enum FinishReason {
    /** The model produced the end-of-sequence token. */
    STOP("stop"),
    /** The request's max tokens were generated. */
    LENGTH("length"),
    /** Aborted, for example by a pause for a weight update. */
    ABORT("abort"),
    /** The engine failed the request (the completion's {@code error} says why). */
    ERROR("error");

    private final String wireName;

    FinishReason(String wireName) {
        this.wireName = wireName;
    }

    /** The name clients see in {@code finish_reason}. */
    public String wireName() {
        return wireName;
    }
}
