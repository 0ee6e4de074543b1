package io.kvpool.config;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;
import org.junit.jupiter.params.provider.ValueSource;

import java.time.Duration;
import java.util.Random;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

class DurationsTest {

    @ParameterizedTest
    @CsvSource({
            "7ns, 7",
            "250us, 250000",
            "500ms, 500000000",
            "10s, 10000000000",
            "2m, 120000000000",
            "1h, 3600000000000",
            "1d, 86400000000000",
            "0s, 0",
            "0ns, 0",
            "1.5s, 1500000000",
            "0.25ms, 250000",
            "1.5h, 5400000000000",
            "10S, 10000000000",
            "10MS, 10000000",
            "' 3 m ', 180000000000",
            "106751d, 9223286400000000000",
    })
    void parsesEveryUnit(String text, long nanos) {
        assertThat(Durations.parse(text)).as("parse(%s)", text).isEqualTo(Duration.ofNanos(nanos));
    }

    @ParameterizedTest
    @ValueSource(strings = {"10", "0", "1.5", "", " ", "s", "ms", "10x", "-1s", "10 sec", "10sec", "1e3s", "10ss",
            "1.s", "PT10S", "10 s s", "1w"})
    void rejectsBareNumbersAndGarbageNamingTheText(String text) {
        assertThatThrownBy(() -> Durations.parse(text))
                .isInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("'" + text + "'");
    }

    @Test
    void rejectsNull() {
        assertThatThrownBy(() -> Durations.parse(null))
                .isInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("missing duration");
    }

    @Test
    void rejectsTooLong() {
        assertThatThrownBy(() -> Durations.parse("106752d"))
                .isInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("'106752d'")
                .hasMessageContaining("too long");
    }

    @ParameterizedTest
    @CsvSource({
            "0, 0s",
            "1, 1ns",
            "1000, 1us",
            "1500, 1500ns",
            "1000000, 1ms",
            "1500000000, 1500ms",
            "10000000000, 10s",
            "90000000000, 90s",
            "120000000000, 2m",
            "3600000000000, 1h",
            "86400000000000, 24h",
            "5400000000000, 90m",
    })
    void formatsInLargestExactUnit(long nanos, String expected) {
        assertThat(Durations.format(Duration.ofNanos(nanos))).isEqualTo(expected);
    }

    @ParameterizedTest
    @ValueSource(strings = {"7ns", "250us", "500ms", "10s", "2m", "1h", "36h", "1500ms", "90s", "1d", "0s", "123456789ns"})
    void formatOfParseRoundTrips(String text) {
        Duration d = Durations.parse(text);
        assertThat(Durations.parse(Durations.format(d))).as("format(parse(%s)) = %s", text, Durations.format(d))
                .isEqualTo(d);
    }

    @Test
    void randomDurationsRoundTrip() {
        long seed = 0xD0_2A710L;
        Random rnd = new Random(seed);
        long[] units = {1L, 1_000L, 1_000_000L, 1_000_000_000L, 60_000_000_000L, 3_600_000_000_000L};
        for (int i = 0; i < 5000; i++) {
            long unit = units[rnd.nextInt(units.length)];
            // up to about 100 days, where every count of nanoseconds is exact in a double
            long nanos = (rnd.nextLong() & ((1L << 52) - 1)) / unit * unit;
            Duration d = Duration.ofNanos(nanos);
            String text = Durations.format(d);
            assertThat(Durations.parse(text)).as("seed=%d i=%d nanos=%d text=%s", seed, i, nanos, text).isEqualTo(d);
        }
    }

    @Test
    void largeNanosecondCountsAreExact() {
        assertThat(Durations.parse("9007199254740993ns")).isEqualTo(Duration.ofNanos(9007199254740993L));
        Duration d = Duration.ofNanos(1_000_000_000_000_000_001L);
        assertThat(Durations.parse(Durations.format(d))).isEqualTo(d);
        assertThatThrownBy(() -> Durations.parse("9223372036854775808ns")).isInstanceOf(IllegalArgumentException.class);
    }

    @Test
    void requirePositive() {
        assertThat(Durations.requirePositive("timeout", Duration.ofMillis(1))).isEqualTo(Duration.ofMillis(1));
        assertThatThrownBy(() -> Durations.requirePositive("timeout", Duration.ZERO))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("timeout").hasMessageContaining("0s");
        assertThatThrownBy(() -> Durations.requirePositive("lease", null))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("lease");
        assertThatThrownBy(() -> Durations.requirePositive("lease", Duration.ofSeconds(-1)))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("lease");
    }
}
