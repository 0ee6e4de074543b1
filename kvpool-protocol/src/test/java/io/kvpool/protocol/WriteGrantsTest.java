package io.kvpool.protocol;

import io.kvpool.protocol.msg.WriteGrant;
import org.junit.jupiter.api.Test;

import static org.assertj.core.api.Assertions.assertThat;

/** Grants verify only for the segment, term and fields they were made for, and cover exactly their range. */
class WriteGrantsTest {

    private static final Secrets POOL = Secrets.of("cluster-secret-of-the-grants-test", "admin-secret-of-the-grants-test");
    private final WriteGrants grants = WriteGrants.of(POOL);

    @Test
    void aGrantChecksOnlyForItsSegmentTermAndFields() {
        WriteGrant g = grants.sign(3, 7, 4096, 1 << 20, 500, 16);
        assertThat(grants.check(g, 3, 7)).isTrue();
        // another holder of the same admin secret (a node) agrees
        assertThat(WriteGrants.of(Secrets.of("cluster-secret-of-the-grants-test", "admin-secret-of-the-grants-test"))
                .check(g, 3, 7)).isTrue();
        assertThat(grants.check(g, 4, 7)).as("another segment").isFalse();
        assertThat(grants.check(g, 3, 8)).as("another term").isFalse();
        for (WriteGrant changed : new WriteGrant[]{
                new WriteGrant(0, g.length(), g.firstGeneration(), g.generationCount(), g.mac()),
                new WriteGrant(g.offset(), g.length() + 64, g.firstGeneration(), g.generationCount(), g.mac()),
                new WriteGrant(g.offset(), g.length(), g.firstGeneration() - 1, g.generationCount(), g.mac()),
                new WriteGrant(g.offset(), g.length(), g.firstGeneration(), g.generationCount() + 1, g.mac())}) {
            assertThat(grants.check(changed, 3, 7)).as(changed.toString()).isFalse();
        }
        // another pool's admin secret, or the cluster secret alone, cannot make or check one
        WriteGrants other = WriteGrants.of(Secrets.of("cluster-secret-of-the-grants-test", "another-admin-secret-entirely"));
        assertThat(other.check(g, 3, 7)).isFalse();
        assertThat(grants.check(other.sign(3, 7, 4096, 1 << 20, 500, 16), 3, 7)).isFalse();
        WriteGrants dataOnly = WriteGrants.of(Secrets.of("cluster-secret-of-the-grants-test", null));
        assertThat(dataOnly.keyed()).isFalse();
        assertThat(dataOnly.sign(3, 7, 0, 64, 1, 1).mac()).containsOnly(0);
        assertThat(dataOnly.check(g, 3, 7)).isFalse();
        assertThat(WriteGrants.UNSIGNED.refusal(g, 3, 7, 4096, 64, 500)).contains("holds no admin secret");
    }

    @Test
    void aGrantCoversItsRangeAndGenerationsAndNothingElse() {
        WriteGrant g = grants.sign(1, 0, 4096, 1024, 500, 3);
        assertThat(grants.refusal(g, 1, 0, 4096, 1024, 500)).isNull();
        assertThat(grants.refusal(g, 1, 0, 4096 + 960, 64, 502)).isNull();
        assertThat(grants.refusal(g, 1, 0, 4096 - 64, 64, 500)).contains("does not cover");
        assertThat(grants.refusal(g, 1, 0, 4096 + 1024, 64, 500)).contains("does not cover");
        assertThat(grants.refusal(g, 1, 0, 4096 + 64, 1024, 500)).as("runs past the end").contains("does not cover");
        assertThat(grants.refusal(g, 1, 0, 4096, 64, 499)).contains("does not cover");
        assertThat(grants.refusal(g, 1, 0, 4096, 64, 503)).contains("does not cover");
        assertThat(grants.refusal(g, -1, 0, 4096, 64, 500)).contains("not registered");
        assertThat(grants.refusal(g, 2, 0, 4096, 64, 500)).contains("not made by this pool's master");
        // extremes do not overflow into a yes
        WriteGrant wide = grants.sign(1, 0, Long.MAX_VALUE - 64, 64, Long.MAX_VALUE - 1, Integer.MAX_VALUE);
        assertThat(grants.refusal(wide, 1, 0, Long.MAX_VALUE - 64, 64, Long.MAX_VALUE - 1)).isNull();
        assertThat(grants.refusal(wide, 1, 0, 0, 64, Long.MIN_VALUE)).contains("does not cover");
        assertThat(grants.refusal(wide, 1, 0, Long.MAX_VALUE - 64, 128, Long.MAX_VALUE - 1)).contains("does not cover");
        assertThat(WriteGrant.none().covers(0, 0, 0)).isFalse();
        assertThat(WriteGrants.of(POOL).toString()).doesNotContain("admin-secret");
    }
}
