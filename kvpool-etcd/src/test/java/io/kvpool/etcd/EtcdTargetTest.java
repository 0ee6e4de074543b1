package io.kvpool.etcd;

import io.kvpool.config.HostPort;
import org.junit.jupiter.api.Test;

import java.nio.charset.StandardCharsets;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** etcd:// addresses and leader records: what parses, and errors that name what is wrong. */
class EtcdTargetTest {

    @Test
    void parsesEndpointsAndCluster() {
        EtcdTarget t = EtcdTarget.parse("etcd://10.0.0.1:2379,[::1]:2380/prod-1");
        assertThat(t.endpoints()).containsExactly(new HostPort("10.0.0.1", 2379), new HostPort("::1", 2380));
        assertThat(t.cluster()).isEqualTo("prod-1");
        assertThat(t.leaderKey()).isEqualTo("/kvpool/prod-1/leader");
        assertThat(t.mastersPrefix()).isEqualTo("/kvpool/prod-1/masters/");
        assertThat(t.nodesPrefix()).isEqualTo("/kvpool/prod-1/nodes/");
        assertThat(EtcdTarget.parse("etcd://h:1").cluster()).isEqualTo(EtcdTarget.DEFAULT_CLUSTER);
        assertThat(EtcdTarget.parse("etcd://h:1/").cluster()).isEqualTo(EtcdTarget.DEFAULT_CLUSTER);
        assertThat(EtcdTarget.parse(t.toString())).isEqualTo(t);
    }

    @Test
    void badTargetsAreNamed() {
        assertThatThrownBy(() -> EtcdTarget.parse("h:1")).hasMessageContaining("not an etcd target");
        assertThatThrownBy(() -> EtcdTarget.parse("etcd://")).hasMessageContaining("empty etcd endpoint");
        assertThatThrownBy(() -> EtcdTarget.parse("etcd://h:1,,h:2")).hasMessageContaining("empty etcd endpoint");
        assertThatThrownBy(() -> EtcdTarget.parse("etcd://h:99999")).hasMessageContaining("port 99999");
        assertThatThrownBy(() -> EtcdTarget.parse("etcd://h:1/a b")).hasMessageContaining("cluster name 'a b'");
        assertThatThrownBy(() -> EtcdTarget.parse("etcd://h:1/" + "x".repeat(65))).hasMessageContaining("1 to 64");
    }

    @Test
    void masterAddressesAreFixedOrElected() {
        assertThat(MasterAddress.parse("h:1")).isEqualTo(new MasterAddress.Fixed(new HostPort("h", 1)));
        assertThat(MasterAddress.parse(" etcd://h:1/c ")).isInstanceOf(MasterAddress.Elected.class);
        assertThat(MasterAddress.parse("etcd://h:1/c").toString()).isEqualTo("etcd://h:1/c");
        assertThatThrownBy(() -> MasterAddress.parse("nohost")).hasMessageContaining("nohost");
    }

    @Test
    void leaderRecordsRoundTripAndBadOnesAreNamed() {
        LeaderRecord r = new LeaderRecord("m1", "10.0.0.1:50051", "10.0.0.1:9003", 42, true);
        assertThat(LeaderRecord.parse(r.toJson())).isEqualTo(r);
        assertThat(LeaderRecord.parse(r.withReady(false).toJson()).ready()).isFalse();
        assertThat(new String(r.toJson(), StandardCharsets.UTF_8)).contains("\"term\":42").contains("\"ready\":true");
        assertThatThrownBy(() -> LeaderRecord.parse("not json".getBytes(StandardCharsets.UTF_8)))
                .hasMessageContaining("not JSON");
        assertThatThrownBy(() -> LeaderRecord.parse("[1]".getBytes(StandardCharsets.UTF_8)))
                .hasMessageContaining("not a JSON object");
        assertThatThrownBy(() -> LeaderRecord.parse(
                "{\"id\":\"m\",\"address\":\"h:1\",\"term\":\"7\",\"ready\":true}".getBytes(StandardCharsets.UTF_8)))
                .hasMessageContaining("term");
        assertThatThrownBy(() -> LeaderRecord.parse(
                "{\"id\":\"m\",\"address\":\"h:1\",\"term\":7}".getBytes(StandardCharsets.UTF_8)))
                .hasMessageContaining("ready");
        assertThatThrownBy(() -> LeaderRecord.parse(
                "{\"address\":\"h:1\",\"term\":7,\"ready\":true}".getBytes(StandardCharsets.UTF_8)))
                .hasMessageContaining("id");
        assertThatThrownBy(() -> new LeaderRecord("m", "h:1", "", -1, true)).hasMessageContaining("negative");
    }

    @Test
    void prefixEndCoversExactlyThePrefix() {
        assertThat(EtcdGateway.prefixEnd("/kvpool/a/")).isEqualTo("/kvpool/a0".getBytes(StandardCharsets.UTF_8));
        assertThat(EtcdGateway.prefixEnd("a\u00ff")).isEqualTo(new byte[]{'a', (byte) 0xC3, (byte) 0xC0});
    }
}
