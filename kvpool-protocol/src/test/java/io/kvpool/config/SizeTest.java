package io.kvpool.config;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;
import org.junit.jupiter.params.provider.ValueSource;

import java.util.Random;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

class SizeTest {

    @ParameterizedTest
    @CsvSource({
            "1KiB, 1024",
            "256KiB, 262144",
            "512MiB, 536870912",
            "4GiB, 4294967296",
            "2TiB, 2199023255552",
            "1KB, 1000",
            "3MB, 3000000",
            "2GB, 2000000000",
            "5TB, 5000000000000",
            "100B, 100",
            "0, 0",
            "1048576, 1048576",
            "9223372036854775807, 9223372036854775807",
            "4gib, 4294967296",
            "4gb, 4000000000",
            "'  8 GiB ', 8589934592",
            "1.5GiB, 1610612736",
            "0.5KiB, 512",
            "1.5KB, 1500",
            "2.25MiB, 2359296",
            "1.0B, 1",
            "10.0, 10",
    })
    void parsesUnitsAndBareBytes(String text, long bytes) {
        assertThat(Size.parse(text).bytes()).as("parse(%s)", text).isEqualTo(bytes);
    }

    @Test
    void largestBinaryUnitsBelowOverflowParse() {
        // 8388607 TiB = 2^63 - 2^40 fits a long
        assertThat(Size.parse("8388607TiB").bytes()).isEqualTo(8388607L << 40);
    }

    @ParameterizedTest
    @ValueSource(strings = {"8GB8", "", " ", "-1", "-1GiB", "GiB", "1.", ".5GiB", "1,5GiB", "4 GiBs", "4PiB", "4XB",
            "1e3", "0x10", "4 G iB", "1.5.5MiB"})
    void rejectsGarbageNamingTheText(String text) {
        assertThatThrownBy(() -> Size.parse(text))
                .isInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("'" + text + "'");
    }

    @ParameterizedTest
    @ValueSource(strings = {"1.5B", "1.5", "0.3KiB", "1.0001KB", "0.1B"})
    void rejectsFractionalBytes(String text) {
        assertThatThrownBy(() -> Size.parse(text))
                .isInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("'" + text + "'")
                .hasMessageContaining("whole number of bytes");
    }

    @ParameterizedTest
    @ValueSource(strings = {"9223372036854775808", "8388608TiB", "9223372036854776KB", "99999999999999999999999TB",
            "8589934592GiB"})
    void rejectsOverflow(String text) {
        assertThatThrownBy(() -> Size.parse(text))
                .isInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("'" + text + "'")
                .hasMessageContaining("too large");
    }

    @Test
    void rejectsNull() {
        assertThatThrownBy(() -> Size.parse(null))
                .isInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("missing size");
    }

    @Test
    void negativeBytesRejectedByConstructor() {
        assertThatThrownBy(() -> new Size(-1)).isInstanceOf(IllegalArgumentException.class).hasMessageContaining("-1");
        assertThatThrownBy(() -> Size.ofBytes(-5)).isInstanceOf(IllegalArgumentException.class);
    }

    @Test
    void factoriesAndOverflow() {
        assertThat(Size.ofKiB(3).bytes()).isEqualTo(3072);
        assertThat(Size.ofMiB(2).bytes()).isEqualTo(2L << 20);
        assertThat(Size.ofGiB(5).bytes()).isEqualTo(5L << 30);
        assertThatThrownBy(() -> Size.ofGiB(Long.MAX_VALUE / 1000)).isInstanceOf(ArithmeticException.class);
    }

    @ParameterizedTest
    @CsvSource({
            "0, 0B",
            "1, 1B",
            "100, 100B",
            "1000, 1000B",
            "1023, 1023B",
            "1024, 1KiB",
            "1536, 1536B",
            "2048, 2KiB",
            "1572864, 1536KiB",
            "1610612736, 1536MiB",
            "8589934592, 8GiB",
            "1099511627776, 1TiB",
            "1125899906842624, 1024TiB",
            "2000000000, 1953125KiB",
            "9223372036854775807, 9223372036854775807B",
    })
    void toStringUsesLargestExactBinaryUnit(long bytes, String expected) {
        assertThat(new Size(bytes).toString()).isEqualTo(expected);
    }

    @Test
    void toStringRoundTripsThroughParse() {
        long seed = 0x5EED_0001L;
        Random rnd = new Random(seed);
        for (int i = 0; i < 5000; i++) {
            long bytes = switch (rnd.nextInt(4)) {
                case 0 -> rnd.nextLong() & Long.MAX_VALUE;
                case 1 -> (long) rnd.nextInt(1 << 20) << (10 * rnd.nextInt(5));
                case 2 -> rnd.nextInt(1 << 16);
                default -> (rnd.nextLong() & ((1L << 40) - 1)) << rnd.nextInt(20);
            };
            Size s = new Size(bytes);
            assertThat(Size.parse(s.toString())).as("seed=%d i=%d bytes=%d text=%s", seed, i, bytes, s).isEqualTo(s);
        }
    }

    @ParameterizedTest
    @CsvSource({
            "0, 0 B",
            "1023, 1023 B",
            "1024, 1.00 KiB",
            "1536, 1.50 KiB",
            "1048575, 1024.00 KiB",
            "1048576, 1.00 MiB",
            "1610612736, 1.50 GiB",
            "1099511627776, 1.00 TiB",
            "1125899906842624, 1.00 PiB",
            "9223372036854775807, 8192.00 PiB",
    })
    void human(long bytes, String expected) {
        assertThat(Size.human(bytes)).isEqualTo(expected);
    }

    @Test
    void comparesByBytes() {
        assertThat(Size.parse("1GiB")).isGreaterThan(Size.parse("1GB"));
        assertThat(Size.parse("1024KiB")).isEqualByComparingTo(Size.parse("1MiB"));
        assertThat(Size.parse("1KB")).isLessThan(Size.parse("1KiB"));
    }
}
