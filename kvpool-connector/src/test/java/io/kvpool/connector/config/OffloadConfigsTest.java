package io.kvpool.connector.config;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Files;
import java.nio.file.Path;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

class OffloadConfigsTest {

    private static final ConnectorFactory.EngineSide ENGINE =
            new ConnectorFactory.EngineSide(16, "0", "m", "v1", "f32", 32768);

    @Test
    void nativeAndPoolConfigsReadFromYamlAndJson(@TempDir Path dir) throws Exception {
        Path y = dir.resolve("offload.yaml");
        Files.writeString(y, """
                type: native
                cpu: 8GiB
                disk:
                  path: /mnt/nvme/kv
                """);
        OffloadConfigs.Loaded n = OffloadConfigs.load(y);
        assertThat(n.warnings()).isEmpty();
        assertThat(n.config()).isInstanceOfSatisfying(OffloadConfig.Native.class, c -> {
            assertThat(c.cpu().bytes()).isEqualTo(8L << 30);
            assertThat(c.disk().path()).isEqualTo(Path.of("/mnt/nvme/kv"));
            assertThat(c.disk().size()).isNull();
        });
        Path j = dir.resolve("client.json");
        Files.writeString(j, "{\"offload\": {\"type\": \"pool\", \"cpu\": \"64GiB\", \"disk\": {\"path\": \"/d\","
                + " \"size\": \"200GiB\"}, \"master\": \"head:50051\", \"promote_after\": 0, \"versioned_keys\": true}}");
        assertThat(OffloadConfigs.load(j).config()).isInstanceOfSatisfying(OffloadConfig.Pool.class, c -> {
            assertThat(c.master()).isEqualTo("head:50051");
            assertThat(c.promoteAfter()).isZero();
            assertThat(c.reset()).isEqualTo("all");
            assertThat(c.versionedKeys()).isTrue();
            assertThat(c.disk().size().bytes()).isEqualTo(200L << 30);
            assertThat(c.shmGroup()).as("no group: segment files stay the node user's").isNull();
        });
        assertThat(((OffloadConfig.Pool) OffloadConfigs.parse("type: pool\ncpu: 1GiB\nshm_group: kvpool", true).config())
                .shmGroup()).isEqualTo("kvpool");
        // tenants travel as the master reads them (its --tenants-file), checked by the launcher
        OffloadConfig.Pool t = (OffloadConfig.Pool) OffloadConfigs.parse("type: pool\ncpu: 1GiB\ntenants:\n"
                + "  - {name: a, prefixes: [kvp1/llama/], memory: 8GiB, over_quota: evict}\n", true).config();
        assertThat(t.tenantsJson()).isEqualTo("{\"tenants\":[{\"name\":\"a\",\"prefixes\":[\"kvp1/llama/\"],"
                + "\"memory\":\"8GiB\",\"over_quota\":\"evict\"}]}");
        assertThat(t.withMaster("h:1").tenantsJson()).isEqualTo(t.tenantsJson());
        OffloadConfig.Pool e = (OffloadConfig.Pool) OffloadConfigs.parse("type: pool\ncpu: 1GiB\nevents: {endpoint: "
                + "'tcp://*:5557', topic: kv@kvpool@llama, info_bytes: 8MiB}\n", true).config();
        assertThat(e.eventFlags()).containsExactly("--kv-events-endpoint", "tcp://*:5557", "--kv-events-topic",
                "kv@kvpool@llama", "--kv-events-info-bytes", "8MiB");
    }

    private static void rejected(String yaml, String... messageParts) {
        assertThatThrownBy(() -> OffloadConfigs.parse(yaml, true)).isInstanceOf(IllegalArgumentException.class)
                .message().contains(messageParts);
    }

    @Test
    void everyRuleNamesItsField() {
        rejected("cpu: 1GiB", "offload.type", "native or pool");
        rejected("type: remote\ncpu: 1GiB", "offload.type", "remote");
        rejected("type: pool\ndisk: {path: /d, size: 1GiB}", "offload.cpu", "disk-only config is rejected");
        rejected("type: native", "offload.cpu: required");
        rejected("type: native\ncpu: lots", "offload.cpu");
        rejected("type: native\ncpu: 1GiB\nmaster: h:1", "offload.master", "pool only");
        rejected("type: pool\ncpu: 1GiB\ncolour: blue", "offload.colour: unknown field", "known fields");
        rejected("type: pool\ncpu_size: 1GiB", "offload.cpu_size", "use cpu");
        rejected("type: pool\ncpu: 1GiB\nmax_local_disk_size: 5GiB", "offload.max_local_disk_size", "use disk.size");
        rejected("type: pool\ncpu: 1GiB\ndisk: {path: /d}", "offload.disk.size: required for type pool");
        rejected("type: pool\ncpu: 1GiB\ndisk: {size: 1GiB}", "offload.disk.path");
        rejected("type: pool\ncpu: 1GiB\nreset: sometimes", "offload.reset");
        rejected("type: pool\ncpu: 1GiB\nmaster: nohost", "offload.master: host:port");
        rejected("type: pool\ncpu: 1GiB\nmaster: 'etcd://h:1/bad name'", "offload.master", "cluster name");
        rejected("type: pool\ncpu: 1GiB\ntransfer: {role: kv_both}", "offload.transfer.connector");
        rejected("type: pool\n  cpu: [", "not valid YAML");
        rejected("type: pool\ncpu: 1GiB\nshm_group: [a]", "offload.shm_group: the name of a group");
        rejected("type: pool\ncpu: 1GiB\nshm_group: ''", "offload.shm_group");
        rejected("type: pool\ncpu: 1GiB\ntenants: {name: a}", "offload.tenants: a list");
        rejected("type: pool\ncpu: 1GiB\nevents: {topic: x}", "offload.events", "endpoint required");
        rejected("type: pool\ncpu: 1GiB\nevents: {endpoint: 'tcp://*:1', port: 3}", "offload.events.port: unknown field");
    }

    @Test
    void harmlessMisplacedFieldsAreWarnedAbout() {
        OffloadConfigs.Loaded l = OffloadConfigs.parse("type: native\ncpu: 1GiB\npromote_after: 3\nreset: model", true);
        assertThat(l.warnings()).containsExactlyInAnyOrder(
                "offload.promote_after: applies to type pool only; ignored for type native",
                "offload.reset: applies to type pool only; ignored for type native");
    }

    @Test
    void rendersAsVllmKvTransferConfigWithMultiConnectorForATransfer() throws Exception {
        ObjectMapper m = new ObjectMapper();
        assertThat(((OffloadConfig.Pool) OffloadConfigs.parse("type: pool\ncpu: 4GiB\nmaster: etcd://e1:2379,e2:2379/prod",
                true).config()).master()).isEqualTo("etcd://e1:2379,e2:2379/prod");
        OffloadConfig pool = OffloadConfigs.parse("type: pool\ncpu: 4GiB\nmaster: head:50051", true).config();
        JsonNode single = m.readTree(ConnectorFactory.toVllmJson(pool, ENGINE));
        assertThat(single.path("kv_connector").asText()).isEqualTo(ConnectorFactory.POOL_CONNECTOR);
        assertThat(single.path("kv_role").asText()).isEqualTo("kv_both");
        assertThat(single.path("kv_connector_extra_config").path("master").asText()).isEqualTo("head:50051");
        assertThat(single.path("kv_connector_extra_config").path("hash").asText()).isEqualTo("sha256_cbor");

        OffloadConfig withTransfer = OffloadConfigs.parse("""
                type: native
                cpu: 2GiB
                transfer:
                  connector: NixlConnector
                  role: kv_producer
                  extra: {backends: [UCX]}
                """, true).config();
        JsonNode multi = m.readTree(ConnectorFactory.toVllmJson(withTransfer, ENGINE));
        assertThat(multi.path("kv_connector").asText()).isEqualTo("MultiConnector");
        JsonNode list = multi.path("kv_connector_extra_config").path("connectors");
        assertThat(list).hasSize(2);
        assertThat(list.get(0).path("kv_connector").asText()).isEqualTo("NixlConnector");
        assertThat(list.get(0).path("kv_connector_extra_config").path("backends").get(0).asText()).isEqualTo("UCX");
        assertThat(list.get(1).path("kv_connector").asText()).isEqualTo(ConnectorFactory.NATIVE_CONNECTOR);
        assertThatThrownBy(() -> ConnectorFactory.build(withTransfer, ENGINE)).hasMessageContaining("offload.transfer");
        assertThatThrownBy(() -> ConnectorFactory.build(OffloadConfigs.parse("type: pool\ncpu: 1GiB", true).config(),
                ENGINE)).hasMessageContaining("offload.master: not set");
    }
}
