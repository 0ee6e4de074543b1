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

    /**
     * A lease given back used up a moment after its grant makes the next ask larger; one given back with room
     * to spare, or used up by another master run's numbering, does not; a kept lease gone idle sets it back.
     */
    @Test
    void theNextAskFollowsHowFastLeasesAreUsedUp() {
        AtomicInteger run = new AtomicInteger(7);
        long[] now = {0};
        try (MasterChannel master = new MasterChannel(ClientConfig.forMaster("127.0.0.1:1"), UUID.randomUUID(), () -> { })) {
            WriteLeasePool pool = new WriteLeasePool(master, () -> now[0], () -> true, run::get);
            // 16 MiB, generations 1..1024, idle after 60 s
            WriteLeaseMessages.Granted g = new WriteLeaseMessages.Granted(ResultCode.OK, 42, 0, 3, 2, 0, 16L << 20, 1,
                    1024, 60_000, new byte[WriteGrant.MAC_BYTES]);

            WriteLeasePool.Lease roomy = new WriteLeasePool.Lease(g, "", 0, run.get(), now[0]);
            roomy.next += 1L << 20;
            now[0] += 1_000_000;
            pool.giveBack(roomy);
            assertThat(pool.sizeFactor()).as("kept with room: not used up").isEqualTo(1);

            WriteLeasePool.Lease full = new WriteLeasePool.Lease(g, "", 0, run.get(), now[0]);
            full.next = full.end; // filled within the millisecond below
            now[0] += 1_000_000;
            pool.giveBack(full);
            assertThat(pool.sizeFactor()).as("used up in 1 ms").isEqualTo(2);

            WriteLeasePool.Lease spent = new WriteLeasePool.Lease(g, "", 0, run.get(), now[0]);
            spent.nextGeneration = spent.lastGeneration + 1; // out of generations
            now[0] += 1_000_000;
            pool.giveBack(spent);
            assertThat(pool.sizeFactor()).as("out of generations in 1 ms").isEqualTo(4);

            // the kept roomy lease has 15 MiB left: too little for a 15.5 MiB object, a moment after its grant
            now[0] += 1_000_000;
            assertThatThrownBy(() -> pool.take("", 31L << 19, 31L << 19, 1, new ResultCode[1]))
                    .as("not kept: the pool asks the master for a fresh lease").isInstanceOf(KvPoolException.class);
            assertThat(pool.sizeFactor()).as("too full for the next object within 4 ms: used up").isEqualTo(8);

            WriteLeasePool.Lease old = new WriteLeasePool.Lease(g, "", 0, run.get(), now[0]);
            old.next = old.end;
            run.incrementAndGet(); // granted by the previous master run: says nothing of this writer's pace
            pool.giveBack(old);
            assertThat(pool.sizeFactor()).isEqualTo(8);

            WriteLeasePool.Lease idle = new WriteLeasePool.Lease(g, "", 0, run.get(), now[0]);
            pool.giveBack(idle);
            now[0] += 31_000_000_000L; // the kept lease sat idle past half its idle timeout
            pool.sweep();
            assertThat(pool.sizeFactor()).as("an idle lease let go").isEqualTo(1);
        }
    }
}
