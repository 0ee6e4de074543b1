package io.kvpool.connector;

/**
 * A request the scheduler runs in this step: its KV blocks (block table: block i holds tokens
 * {@code [i*blockSize, (i+1)*blockSize)}) and the tokens whose KV exists before and after the step.
 * The connector saves the blocks that become full during the step. Computed tokens past the
 * request's ({@code computedAfter > request.numTokens()}) are refused: they have no token ids to
 * hash, so no key.
 */
public record ScheduledRequest(ConnectorRequest request, int[] blockIds, int computedBefore, int computedAfter) {

    public ScheduledRequest {
        if (computedBefore < 0 || computedAfter < computedBefore) {
            throw new IllegalArgumentException("request " + request.id() + ": computed tokens go from " + computedBefore
                    + " to " + computedAfter);
        }
        if (computedAfter > request.numTokens()) {
            throw new IllegalArgumentException("request " + request.id() + ": " + computedAfter
                    + " tokens computed but only " + request.numTokens() + " known");
        }
    }
}
