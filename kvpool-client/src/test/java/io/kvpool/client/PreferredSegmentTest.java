package io.kvpool.client;

import org.junit.jupiter.api.Test;

import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.UUID;
import java.util.function.Supplier;

import static org.assertj.core.api.Assertions.assertThat;

class PreferredSegmentTest {

    private static final UUID ID = new UUID(1, 2);
    private static final Supplier<List<String>> LOCAL = () -> List.of("10.0.0.1:50052");
    private static final Supplier<List<String>> NONE = List::of;

    @Test
    void mostExplicitWins() {
        assertThat(PreferredSegment.choose("call:1", "conf:1", "env:1", true, LOCAL, ID)).isEqualTo("call:1");
        assertThat(PreferredSegment.choose(null, "conf:1", "env:1", true, LOCAL, ID)).isEqualTo("conf:1");
        assertThat(PreferredSegment.choose("", "", "env:1", true, LOCAL, ID)).isEqualTo("env:1");
        assertThat(PreferredSegment.choose(null, null, null, true, LOCAL, ID)).isEqualTo("10.0.0.1:50052");
    }

    @Test
    void noPreferenceLeavesItToTheMaster() {
        assertThat(PreferredSegment.choose(null, null, null, true, NONE, ID)).isNull();
        assertThat(PreferredSegment.choose(null, null, null, false, LOCAL, ID)).isNull();
    }

    @Test
    void explicitChoicesDoNotEvenLookAtLocalSegments() {
        Supplier<List<String>> boom = () -> {
            throw new AssertionError("local detection must not run when something explicit is set");
        };
        assertThat(PreferredSegment.choose(null, null, "env:1", true, boom, ID)).isEqualTo("env:1");
    }

    @Test
    void clientsSpreadOverSeveralLocalSegmentsAndEachSticksToOne() {
        List<String> local = List.of("h:1", "h:2", "h:3");
        Set<String> seen = new HashSet<>();
        for (int i = 0; i < 64; i++) {
            UUID id = new UUID(i * 7919L, i * 104729L);
            String first = PreferredSegment.choose(null, null, null, true, () -> local, id);
            assertThat(PreferredSegment.choose(null, null, null, true, () -> local, id)).isEqualTo(first);
            seen.add(first);
        }
        assertThat(seen).containsExactlyInAnyOrderElementsOf(local);
    }
}
