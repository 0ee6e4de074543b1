package io.kvpool.client;

import io.kvpool.config.HostPort;
import io.kvpool.etcd.EtcdTarget;
import io.kvpool.etcd.MasterAddress;
import org.junit.jupiter.api.Test;

import java.time.Duration;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

class ClientConfigTest {

    @Test
    void defaults() {
        ClientConfig c = ClientConfig.forMaster("10.0.0.1:50051");
        assertThat(c.master()).isEqualTo(new MasterAddress.Fixed(new HostPort("10.0.0.1", 50051)));
        assertThat(c.replicas()).isZero();
        assertThat(c.autoDetectLocal()).isTrue();
        assertThat(c.preferredSegment()).isNull();
        assertThat(c.requestTimeout()).isEqualTo(ClientConfig.DEFAULT_REQUEST_TIMEOUT);
        assertThat(c.diskLoadBudget()).isEqualTo(ClientConfig.DEFAULT_DISK_LOAD_BUDGET);
    }

    @Test
    void etcdAddressesNameTheElectedMasters() {
        ClientConfig c = ClientConfig.forMaster("etcd://10.0.0.1:2379,10.0.0.2:2379/prod");
        assertThat(c.master()).isInstanceOf(MasterAddress.Elected.class);
        EtcdTarget t = ((MasterAddress.Elected) c.master()).target();
        assertThat(t.endpoints()).containsExactly(new HostPort("10.0.0.1", 2379), new HostPort("10.0.0.2", 2379));
        assertThat(t.cluster()).isEqualTo("prod");
        assertThat(t.leaderKey()).isEqualTo("/kvpool/prod/leader");
        assertThat(ClientConfig.forMaster("ETCD://h:1").master().toString()).isEqualTo("etcd://h:1/default");
    }

    @Test
    void badValuesAreNamed() {
        assertThatThrownBy(() -> ClientConfig.forMaster("nohost")).hasMessageContaining("nohost");
        assertThatThrownBy(() -> ClientConfig.forMaster("etcd://")).hasMessageContaining("etcd://");
        assertThatThrownBy(() -> ClientConfig.forMaster("etcd://h:2379/bad name")).hasMessageContaining("bad name");
        ClientConfig c = ClientConfig.forMaster("h:1");
        assertThatThrownBy(() -> c.withReplicas(9)).hasMessageContaining("replicas");
        assertThatThrownBy(() -> c.withMaxConnections(0)).hasMessageContaining("maxConnections");
        assertThatThrownBy(() -> c.withRequestTimeout(Duration.ZERO)).hasMessageContaining("request timeout");
        assertThatThrownBy(() -> c.withPreferredSegment("not-a-segment")).hasMessageContaining("not-a-segment");
        assertThatThrownBy(() -> new PutOptions(null, -1)).hasMessageContaining("replicas");
        assertThatThrownBy(() -> c.withDiskLoadBudget(1000)).hasMessageContaining("diskLoadBudget");
    }
}
