package io.kvpool.config;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;
import org.junit.jupiter.params.provider.ValueSource;

import java.net.InetSocketAddress;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

class HostPortTest {

    @ParameterizedTest
    @CsvSource({
            "127.0.0.1:50051, 127.0.0.1, 50051",
            "10.0.0.1:1, 10.0.0.1, 1",
            "head-node:50051, head-node, 50051",
            "localhost:0, localhost, 0",
            "localhost:65535, localhost, 65535",
            "[::1]:50051, ::1, 50051",
            "[fe80::1%eth0]:8080, fe80::1%eth0, 8080",
            "'  host:80  ', host, 80",
    })
    void parsesHostAndPort(String text, String host, int port) {
        HostPort hp = HostPort.parse(text);
        assertThat(hp.host()).isEqualTo(host);
        assertThat(hp.port()).isEqualTo(port);
    }

    @Test
    void toStringBracketsIpv6AndRoundTrips() {
        assertThat(HostPort.parse("[::1]:50051").toString()).isEqualTo("[::1]:50051");
        assertThat(HostPort.parse("node-3:7").toString()).isEqualTo("node-3:7");
        for (String s : new String[]{"[::1]:50051", "10.1.2.3:9", "a:65535", "[2001:db8::2]:1"}) {
            assertThat(HostPort.parse(HostPort.parse(s).toString())).as(s).isEqualTo(HostPort.parse(s));
        }
    }

    @Test
    void toSocketAddress() {
        InetSocketAddress a = new HostPort("127.0.0.1", 4242).toSocketAddress();
        assertThat(a.getPort()).isEqualTo(4242);
        assertThat(a.getHostString()).isEqualTo("127.0.0.1");
    }

    @ParameterizedTest
    @ValueSource(strings = {"host:65536", "host:-1", "host:99999999"})
    void rejectsPortsOutOfRange(String text) {
        assertThatThrownBy(() -> HostPort.parse(text))
                .isInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("'" + text + "'")
                .hasMessageContaining("0..65535");
    }

    @ParameterizedTest
    @ValueSource(strings = {"host:abc", "host:80x", "host: 80", "[::1]", "host:99999999999"})
    void rejectsPortsThatAreNotNumbers(String text) {
        assertThatThrownBy(() -> HostPort.parse(text))
                .isInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("'" + text + "'");
    }

    @ParameterizedTest
    @ValueSource(strings = {"host", "host:", ":50051", "127.0.0.1"})
    void rejectsMissingHostOrPort(String text) {
        assertThatThrownBy(() -> HostPort.parse(text))
                .isInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("'" + text + "'")
                .hasMessageContaining("host:port");
    }

    @Test
    void rejectsEmptyAndNull() {
        assertThatThrownBy(() -> HostPort.parse("")).isInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("missing address");
        assertThatThrownBy(() -> HostPort.parse("   ")).isInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("missing address");
        assertThatThrownBy(() -> HostPort.parse(null)).isInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("missing address");
    }

    @Test
    void constructorValidates() {
        assertThatThrownBy(() -> new HostPort(" ", 1)).isInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("no host");
        assertThatThrownBy(() -> new HostPort("h", 70000)).isInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("70000");
    }
}
