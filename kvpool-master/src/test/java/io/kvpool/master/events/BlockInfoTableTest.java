package io.kvpool.master.events;

import io.kvpool.protocol.BlockInfo;
import org.junit.jupiter.api.Test;

import java.nio.charset.StandardCharsets;

import static org.assertj.core.api.Assertions.assertThat;

/** The block infos the master keeps for its KV events: bounded by their bytes, the oldest let go first. */
class BlockInfoTableTest {

    private static byte[] key(int i) {
        return String.format("k/%03d", i).getBytes(StandardCharsets.US_ASCII);
    }

    private static BlockInfo info(int tokens) {
        return BlockInfo.of(null, 16, new int[tokens]);
    }

    @Test
    void keepsWhatFitsAndLetsTheOldestGo() {
        long one = BlockInfoTable.cost(key(0), info(16));
        BlockInfoTable t = new BlockInfoTable(10 * one);
        for (int i = 0; i < 10; i++) {
            t.put(key(i), info(16));
        }
        assertThat(t.size()).isEqualTo(10);
        assertThat(t.bytes()).isEqualTo(10 * one);
        t.put(key(10), info(16));
        assertThat(t.get(key(0))).as("the oldest let go").isNull();
        assertThat(t.get(key(1))).isNotNull();
        assertThat(t.get(key(10))).isEqualTo(info(16));
        assertThat(t.letGo()).isEqualTo(1);
        assertThat(t.bytes()).isLessThanOrEqualTo(10 * one);
    }

    @Test
    void replacingAnInfoCountsItsBytesOnce() {
        BlockInfoTable t = new BlockInfoTable(1 << 20);
        t.put(key(1), info(16));
        t.put(key(1), info(32));
        assertThat(t.size()).isOne();
        assertThat(t.bytes()).isEqualTo(BlockInfoTable.cost(key(1), info(32)));
    }

    @Test
    void anInfoLargerThanTheWholeTableIsNotKeptAndEvictsNothing() {
        BlockInfoTable t = new BlockInfoTable(BlockInfoTable.cost(key(1), info(16)));
        t.put(key(1), info(16));
        t.put(key(2), info(1000));
        assertThat(t.get(key(1))).isNotNull();
        assertThat(t.get(key(2))).isNull();
        assertThat(t.letGo()).isOne();
        assertThat(new BlockInfoTable(0).size()).isZero();
    }
}
