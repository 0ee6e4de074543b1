package io.kvpool.master.events;

import org.junit.jupiter.api.Test;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** Bad settings are refused with a message that names the flag. */
class KvEventsConfigTest {

    @Test
    void offByDefaultAndOnAtAnEndpoint() {
        assertThat(KvEventsConfig.OFF.enabled()).isFalse();
        KvEventsConfig on = KvEventsConfig.at(KvEventsConfig.DEFAULT_ENDPOINT).withReplay("tcp://*:5558");
        assertThat(on.enabled()).isTrue();
        assertThat(on.topic()).isEmpty();
        assertThat(on.bufferSteps()).isEqualTo(10_000);
        assertThat(KvEventsConfig.at("tcp://127.0.0.1:*").endpoint()).isEqualTo("tcp://127.0.0.1:*");
        assertThat(KvEventsConfig.at("tcp://[::1]:5557").enabled()).isTrue();
        assertThat(KvEventsConfig.at("ipc:///tmp/kv-events").enabled()).isTrue();
    }

    @Test
    void badValuesNameTheirFlag() {
        assertThatThrownBy(() -> KvEventsConfig.at("http://x:1")).hasMessageContaining("--kv-events-endpoint")
                .hasMessageContaining("tcp://HOST:PORT");
        assertThatThrownBy(() -> KvEventsConfig.at("tcp://x")).hasMessageContaining("--kv-events-endpoint");
        assertThatThrownBy(() -> KvEventsConfig.at("tcp://x:70000")).hasMessageContaining("--kv-events-endpoint")
                .hasMessageContaining("out of range");
        assertThatThrownBy(() -> KvEventsConfig.at("tcp://*:5557").withReplay("tcp://*:5557"))
                .hasMessageContaining("--kv-events-replay-endpoint").hasMessageContaining("must differ");
        assertThatThrownBy(() -> KvEventsConfig.OFF.withReplay("tcp://*:5558"))
                .hasMessageContaining("--kv-events-replay-endpoint").hasMessageContaining("--kv-events-endpoint");
        assertThatThrownBy(() -> KvEventsConfig.at("tcp://*:1").withBufferSteps(0))
                .hasMessageContaining("--kv-events-buffer-steps");
        assertThatThrownBy(() -> KvEventsConfig.at("tcp://*:1").withQueueSize(-1))
                .hasMessageContaining("--kv-events-queue-size");
        assertThatThrownBy(() -> new KvEventsConfig("tcp://*:1", null, "", 1, 1, -1, 0))
                .hasMessageContaining("--kv-events-hwm");
        assertThatThrownBy(() -> KvEventsConfig.at("tcp://*:1").withInfoBytes(-1))
                .hasMessageContaining("--kv-events-info-bytes");
    }
}
