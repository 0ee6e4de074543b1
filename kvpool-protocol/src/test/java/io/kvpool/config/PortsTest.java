package io.kvpool.config;

import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.util.HashSet;
import java.util.Set;

import static org.assertj.core.api.Assertions.assertThat;

class PortsTest {

    @Test
    void aReservablePortIsBelowTheEphemeralRangeAndBindable() throws IOException {
        int below = Ports.ephemeralStart();
        for (int i = 0; i < 20; i++) {
            int port = Ports.reservable();
            assertThat(port).isLessThan(below).isGreaterThanOrEqualTo(Math.min(Ports.LOWEST, below - 1_000));
            try (ServerSocket s = new ServerSocket()) {
                s.bind(new InetSocketAddress(InetAddress.getLoopbackAddress(), port));
                assertThat(s.getLocalPort()).isEqualTo(port);
            }
        }
    }

    @Test
    void aProcessNeverHandsOutOnePortTwiceEvenBeforeAnyIsBound() throws IOException {
        Set<Integer> seen = new HashSet<>();
        for (int i = 0; i < 2_000; i++) {
            assertThat(seen.add(Ports.reservable())).as("port handed out twice after %d", i).isTrue();
        }
    }

    @Test
    void aPortInUseOnLoopbackOrAnyAddressIsNotBindable() throws IOException {
        int port = Ports.reservable();
        try (ServerSocket taken = new ServerSocket()) {
            taken.bind(new InetSocketAddress(InetAddress.getLoopbackAddress(), port));
            assertThat(Ports.bindable(port)).isFalse();
        }
        assertThat(Ports.bindable(port)).isTrue();
        try (ServerSocket taken = new ServerSocket()) {
            taken.bind(new InetSocketAddress(port));
            assertThat(Ports.bindable(port)).isFalse();
        }
    }
}
