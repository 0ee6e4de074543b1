package io.kvpool.client;

import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.WriteGrant;
import io.kvpool.protocol.msg.WriteLeaseMessages;
import org.junit.jupiter.api.Test;

import java.util.UUID;
import java.util.concurrent.atomic.AtomicInteger;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** Which kept write leases a put may use again. */
class WriteLeasePoolTest {

    /**
     * A lease asked for before the master changed, given back after (its put was in flight when the
     * client met the new master, which dropped only the idle leases), is not kept: its segment id
     * belongs to the old master's numbering and may name another node now (issue 25).
     */
    @Test
    void aLeaseOfThePreviousMasterRunIsNotKept() {
        AtomicInteger run = new AtomicInteger(7);
        // a master nobody answers at: a fresh grant would fail, so only a kept lease can be handed out
        try (MasterChannel master = new MasterChannel(ClientConfig.forMaster("127.0.0.1:1"), UUID.randomUUID(), () -> { })) {
            WriteLeasePool pool = new WriteLeasePool(master, () -> 0L, () -> true, run::get);
            WriteLeaseMessages.Granted g = new WriteLeaseMessages.Granted(ResultCode.OK, 42, 0, 3, 2, 0, 16L << 20, 1,
                    1024, 60_000, new byte[WriteGrant.MAC_BYTES]);

            WriteLeasePool.Lease kept = new WriteLeasePool.Lease(g, "", 0, run.get(), 0L);
            pool.giveBack(kept);
            assertThat(pool.take("", 4096, 4096, 1, new ResultCode[1])).as("same master: used again").isSameAs(kept);

            WriteLeasePool.Lease inFlight = new WriteLeasePool.Lease(g, "", 0, run.get(), 0L);
            run.incrementAndGet(); // the client met a new master meanwhile
            pool.giveBack(inFlight);
            assertThatThrownBy(() -> pool.take("", 4096, 4096, 1, new ResultCode[1]))
                    .as("not kept: the pool asks the master for a fresh lease").isInstanceOf(KvPoolException.class);
        }
    }
}
