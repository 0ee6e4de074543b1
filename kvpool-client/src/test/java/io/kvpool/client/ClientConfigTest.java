package io.kvpool.client;

import org.junit.jupiter.api.Test;

import java.time.Duration;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

class ClientConfigTest {

    @Test
    void defaults() {
        ClientConfig c = ClientConfig.forMaster("10.0.0.1:50051");
        assertThat(c.master().host()).isEqualTo("10.0.0.1");
        assertThat(c.master().port()).isEqualTo(50051);
        assertThat(c.replicas()).isZero();
        assertThat(c.autoDetectLocal()).isTrue();
        assertThat(c.preferredSegment()).isNull();
        assertThat(c.requestTimeout()).isEqualTo(ClientConfig.DEFAULT_REQUEST_TIMEOUT);
        assertThat(c.diskLoadBudget()).isEqualTo(ClientConfig.DEFAULT_DISK_LOAD_BUDGET);
    }

    @Test
    void badValuesAreNamed() {
        assertThatThrownBy(() -> ClientConfig.forMaster("nohost")).hasMessageContaining("nohost");
        ClientConfig c = ClientConfig.forMaster("h:1");
        assertThatThrownBy(() -> c.withReplicas(9)).hasMessageContaining("replicas");
        assertThatThrownBy(() -> c.withMaxConnections(0)).hasMessageContaining("maxConnections");
        assertThatThrownBy(() -> c.withRequestTimeout(Duration.ZERO)).hasMessageContaining("request timeout");
        assertThatThrownBy(() -> c.withPreferredSegment("not-a-segment")).hasMessageContaining("not-a-segment");
        assertThatThrownBy(() -> new PutOptions(null, -1)).hasMessageContaining("replicas");
        assertThatThrownBy(() -> c.withDiskLoadBudget(1000)).hasMessageContaining("diskLoadBudget");
    }
}
