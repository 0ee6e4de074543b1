package io.kvpool.client;

import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.MasterMessages.ReplicaList;
import io.kvpool.protocol.msg.Replica;
import org.junit.jupiter.api.Test;

import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;

/** The tier log line counts each key once, by the tier it was listed in and whether it was read. */
class TierLineTest {

    private static ReplicaList listed(long length, Tier tier) {
        return new ReplicaList(ResultCode.OK, length, 7, List.of(new Replica(1, tier, 0)));
    }

    @Test
    void countsKeysAndBytesPerTier() {
        ReplicaList[] where = {
                listed(100, Tier.MEMORY),            // read from memory
                listed(1000, Tier.DISK),             // read from disk
                listed(2000, Tier.DISK),             // listed on disk but the read failed
                ReplicaList.NOT_FOUND,               // not in the pool
                listed(50, Tier.MEMORY),             // read from memory
        };
        long[] lengths = {100, 1000, KvPoolClient.MISS, KvPoolClient.MISS, 50};
        assertThat(ObjectReads.tierLine(where, lengths)).isEqualTo("load batch: keys=5 memory_keys=2 disk_keys=2"
                + " missing_keys=1 success_keys=3 failed_keys=1 bytes_memory=150 bytes_disk=1000");
    }

    @Test
    void anEmptyBatchIsAllZeros() {
        assertThat(ObjectReads.tierLine(new ReplicaList[0], new long[0])).isEqualTo("load batch: keys=0 memory_keys=0"
                + " disk_keys=0 missing_keys=0 success_keys=0 failed_keys=0 bytes_memory=0 bytes_disk=0");
    }
}
