package io.kvpool.node;

import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.WriteLeaseMessages;

import java.io.IOException;
import java.util.List;

/**
 * A master running in the node's process ({@code kvpool serve}) that takes the COMMITs the node sends for
 * its writers (NODE_WRITE_COMMIT) as calls: the master's code per item, or an exception when it cannot
 * answer (not leading, stopping), after which the writer commits itself.
 */
@FunctionalInterface
public interface InProcessCommits {
    List<ResultCode> commit(WriteLeaseMessages.Commit commit) throws IOException;
}
