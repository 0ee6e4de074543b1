package io.kvpool.it;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.KvPoolException;
import io.kvpool.client.PoolStats;
import io.kvpool.client.PutInParts;
import io.kvpool.client.PutOptions;
import io.kvpool.client.PutStatus;
import io.kvpool.config.HostPort;
import io.kvpool.config.Size;
import io.kvpool.protocol.Access;
import io.kvpool.protocol.AuthenticationException;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.FrameStatus;
import io.kvpool.protocol.Limits;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.RemoteException;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.Secrets;
import io.kvpool.protocol.msg.ControlToken;
import io.kvpool.protocol.msg.MasterMessages.RegisterNode;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.NodeMessages;
import io.kvpool.protocol.msg.WriteGrant;
import com.sun.net.httpserver.HttpServer;
import io.kvpool.web.StatusPages;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermission;
import java.time.Duration;
import java.util.Arrays;
import java.util.List;
import java.util.Random;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;
import static org.assertj.core.api.Assertions.catchThrowableOfType;

/**
 * A pool whose master and node hold the secrets (protocol version 8), probed the way the issue's
 * outside probe did: bare frames with no proof, a wrong secret, the cluster secret where the admin
 * secret is needed. Each is refused with UNAUTHORIZED naming what is missing, nothing stored is
 * lost or changed, and clients holding the secrets are served on both data paths.
 */
class SecuredPoolIT {

    private static final Secrets BOTH = Secrets.of("cluster-secret-of-the-secured-pool-it", "admin-secret-of-the-secured-pool-it");
    private static final Secrets DATA_ONLY = Secrets.of("cluster-secret-of-the-secured-pool-it", null);
    private static final Duration CALL = Duration.ofSeconds(10);
    private static final byte[] KEPT = Payloads.make("kept", 1, 100_000);

    private static InProcessCluster cluster;
    private static KvPoolClient admin;
    /** The node's own /metrics, as `kvpool node --http-port` serves it: where its refusals are counted. */
    private static HttpServer nodeHttp;

    @BeforeAll
    static void start() throws Exception {
        cluster = new InProcessCluster(1, Size.ofMiB(32), m -> m.withSecrets(BOTH), n -> n.withSecrets(BOTH));
        nodeHttp = StatusPages.listen("node", "127.0.0.1", 0);
        PrometheusRegistry registry = new PrometheusRegistry();
        cluster.nodes.getFirst().registerMetrics(registry);
        cluster.nodes.getFirst().mountStatus(nodeHttp, "/", registry);
        nodeHttp.start();
        admin = cluster.client(c -> c.withSecrets(BOTH));
        assertThat(admin.put("kept", KEPT)).isEqualTo(PutStatus.OK);
    }

    @AfterAll
    static void stop() {
        // every probe left what was stored in place
        assertThat(admin.get("kept")).hasValueSatisfying(b -> assertThat(b).isEqualTo(KEPT));
        admin.close();
        nodeHttp.stop(0);
        cluster.close();
    }

    /** A counter of the node's own /metrics. */
    private static double nodeMetric(String name) throws Exception {
        String body = java.net.http.HttpClient.newHttpClient().send(java.net.http.HttpRequest.newBuilder(
                java.net.URI.create("http://127.0.0.1:" + nodeHttp.getAddress().getPort() + "/metrics")).build(),
                java.net.http.HttpResponse.BodyHandlers.ofString()).body();
        java.util.regex.Matcher m = java.util.regex.Pattern.compile("^" + java.util.regex.Pattern.quote(name) + " (\\S+)$",
                java.util.regex.Pattern.MULTILINE).matcher(body);
        assertThat(m.find()).as(name + " in the node's /metrics:\n" + body).isTrue();
        return Double.parseDouble(m.group(1));
    }

    private static HostPort master() {
        return HostPort.parse(cluster.masterAddress());
    }

    private static HostPort node() {
        PoolStats.SegmentStats s = admin.stats().segments().getFirst();
        return new HostPort(s.host(), s.port());
    }

    private static RemoteException refused(HostPort to, Secrets as, Opcode op, BodyWriter body) throws Exception {
        try (FrameConnection c = FrameConnection.connect(to, CALL, Limits.DEFAULT, as)) {
            RemoteException e = catchThrowableOfType(RemoteException.class, () -> c.call(op, body, CALL));
            assertThat(e).as(op + " should be refused").isNotNull();
            assertThat(e.status()).isEqualTo(FrameStatus.UNAUTHORIZED);
            return e;
        }
    }

    @Test
    void clientsWithTheSecretsAreServedOnBothPaths() {
        for (boolean shm : new boolean[]{true, false}) {
            try (KvPoolClient c = cluster.client(cfg -> cfg.withSecrets(DATA_ONLY).withSharedMemory(shm))) {
                byte[] v = Payloads.make("data/" + shm, 2, 50_000);
                assertThat(c.put("data/" + shm, v)).isEqualTo(PutStatus.OK);
                assertThat(c.get("data/" + shm)).hasValueSatisfying(b -> assertThat(b).isEqualTo(v));
                assertThat(c.get("kept")).hasValueSatisfying(b -> assertThat(b).isEqualTo(KEPT));
            }
        }
    }

    @Test
    void theSegmentFileIsReadableByTheNodesUserAlone() throws Exception {
        String shm = admin.stats().segments().getFirst().shmPath();
        assertThat(shm).isNotEmpty();
        assertThat(Files.getPosixFilePermissions(Path.of(shm)))
                .containsExactlyInAnyOrder(PosixFilePermission.OWNER_READ, PosixFilePermission.OWNER_WRITE);
    }

    @Test
    void bareFramesWithoutAProofAreRefusedOnMasterAndNode() throws Exception {
        // the probe's read, in-place overwrite and reset, sent with no proof at all
        double authRefusedBefore = nodeMetric("node_auth_refused_total");
        RemoteException e = refused(master(), Secrets.NONE, Opcode.GET_REPLICA_LIST,
                new BodyWriter().i32(1).bytes("kept".getBytes()));
        assertThat(e.getMessage()).contains("needs the cluster secret").contains("KVPOOL_SECRET_FILE");
        refused(node(), Secrets.NONE, Opcode.NODE_READ, new BodyWriter().i32(0));
        refused(node(), Secrets.NONE, Opcode.NODE_WRITE, new BodyWriter());
        e = refused(node(), Secrets.NONE, Opcode.NODE_RESET, new BodyWriter().i64(1L << 62).i64(0));
        assertThat(e.getMessage()).contains("node_reset needs the admin secret");
        // each refusal is counted where an operator's Prometheus scrapes the node
        assertThat(nodeMetric("node_auth_refused_total")).isGreaterThanOrEqualTo(authRefusedBefore + 3);
        refused(master(), Secrets.NONE, Opcode.REMOVE_ALL, new BodyWriter().bool(true));
        // a put still works: the node was not fenced
        assertThat(admin.put("after-bare-frames", new byte[100])).isEqualTo(PutStatus.OK);
    }

    /** One NODE_WRITE of {@code value} on a fresh connection proving the cluster secret: its codes, or the refusal. */
    private static Object nodeWrite(long epoch, long term, long offset, long generation, byte[] key, byte[] value,
                                    WriteGrant grant) throws Exception {
        try (FrameConnection c = FrameConnection.connect(node(), CALL, Limits.DEFAULT, DATA_ONLY)) {
            BodyWriter w = new BodyWriter();
            new NodeMessages.Write(epoch, term, List.of(new NodeMessages.WriteItem(offset, generation, key, value.length,
                    ObjectLayout.valueCrc(MemorySegment.ofArray(value)), grant))).write(w);
            try {
                return MasterMessages.Codes.read(c.call(Opcode.NODE_WRITE, w, CALL, ByteBuffer.wrap(value)).body()).codes();
            } catch (RemoteException e) {
                return e;
            }
        }
    }

    @Test
    void theClusterSecretWritesOnlyWhatTheMasterGranted() throws Exception {
        byte[] victim = Payloads.make("victim", 3, 4096);
        assertThat(admin.put("victim", victim)).isEqualTo(PutStatus.OK);
        byte[] forged = new byte[4096];
        Arrays.fill(forged, (byte) 0x66);
        long region = ObjectLayout.regionLength("victim".length(), forged.length);
        double grantsRefusedBefore = nodeMetric("node_write_grants_refused_total");
        try (FrameConnection m = FrameConnection.connect(master(), CALL, Limits.DEFAULT, DATA_ONLY)) {
            // where the victim lives, as GET_REPLICA_LIST hands it to anyone with the cluster secret
            MasterMessages.ReplicaList where = MasterMessages.ReplicaListReply.read(m.call(Opcode.GET_REPLICA_LIST,
                    new BodyWriter().i32(1).bytes("victim".getBytes()), CALL).body()).items().getFirst();
            long offset = where.replicas().getFirst().offset();
            long gen = where.generation();
            // the attacker's own put, with its genuine grant
            BodyWriter w = new BodyWriter();
            new MasterMessages.PutStart(false, 1, "", List.of(new MasterMessages.PutStartItem("mine!!".getBytes(),
                    forged.length))).write(w);
            MasterMessages.PutStartReply own = MasterMessages.PutStartReply.read(m.call(Opcode.PUT_START, w, CALL).body());
            MasterMessages.PutStartResult mine = own.results().getFirst();
            assertThat(mine.code()).isEqualTo(ResultCode.OK);
            WriteGrant ownGrant = mine.grant(0, region);
            byte[] madeUp = new byte[WriteGrant.MAC_BYTES];
            new Random(7).nextBytes(madeUp);
            byte[] key = "victim".getBytes();
            List<Object> attempts = List.of(
                    // the probe: the victim's offset and generation, no grant
                    nodeWrite(own.epoch(), own.term(), offset, gen, key, forged, WriteGrant.none()),
                    // a grant of exactly that region with a made-up MAC
                    nodeWrite(own.epoch(), own.term(), offset, gen, key, forged, WriteGrant.region(offset, region, gen, madeUp)),
                    // the attacker's genuine grant, widened to cover the victim
                    nodeWrite(own.epoch(), own.term(), offset, gen, key, forged, new WriteGrant(0, Long.MAX_VALUE / 2,
                            0, Integer.MAX_VALUE, ownGrant.mac())),
                    // the genuine grant as it is, used for the victim's region
                    nodeWrite(own.epoch(), own.term(), offset, gen, key, forged, ownGrant),
                    // the genuine grant for its own region, under another term than the one it was made for
                    nodeWrite(own.epoch(), own.term() + 1, ownGrant.offset(), mine.generation(), "mine!!".getBytes(),
                            forged, ownGrant));
            for (Object a : attempts) {
                assertThat(a).isInstanceOfSatisfying(RemoteException.class, e -> {
                    assertThat(e.status()).isEqualTo(FrameStatus.UNAUTHORIZED);
                    assertThat(e.getMessage()).contains("refuses a write without the admin secret").contains("grant");
                });
            }
            // the control: the genuine grant writes the region it was made for
            assertThat(nodeWrite(own.epoch(), own.term(), ownGrant.offset(), mine.generation(), "mine!!".getBytes(),
                    forged, ownGrant)).isEqualTo(List.of(ResultCode.OK));
        }
        assertThat(admin.get("victim")).hasValueSatisfying(b -> assertThat(b).isEqualTo(victim));
        // the five forged writes are counted on the node's own /metrics (the genuine one is not)
        assertThat(nodeMetric("node_write_grants_refused_total")).isGreaterThanOrEqualTo(grantsRefusedBefore + 5);
    }

    /**
     * Puts in parts and ranged reads with the cluster secret alone, on both paths and both put
     * protocols: NODE_PART_BEGIN is admitted by the master's grants like NODE_WRITE; one over the
     * victim's region without a grant is refused before anything is held, and the victim is intact.
     */
    @Test
    void theClusterSecretWritesInPartsWhatTheMasterGrantedAndReadsRanges() throws Exception {
        for (boolean shm : new boolean[]{true, false}) {
            for (boolean leases : new boolean[]{true, false}) {
                try (KvPoolClient c = cluster.client(cfg -> cfg.withSecrets(DATA_ONLY).withSharedMemory(shm)
                        .withWriteLeases(leases))) {
                    String key = "parts/" + shm + "/" + leases;
                    byte[] v = Payloads.make(key, 1, 64 << 10);
                    try (PutInParts parts = c.beginPut(List.of(key), new long[]{v.length}, PutOptions.DEFAULT)) {
                        parts.write(0, 32 << 10, MemorySegment.ofArray(v).asSlice(32 << 10, 32 << 10));
                        parts.write(0, 0, MemorySegment.ofArray(v).asSlice(0, 32 << 10));
                        assertThat(parts.finish()).as(key).containsExactly(PutStatus.OK);
                    }
                    byte[] half = new byte[32 << 10];
                    assertThat(c.getRangeInto(key, 32 << 10, MemorySegment.ofArray(half))).isEqualTo(32 << 10);
                    assertThat(half).isEqualTo(Arrays.copyOfRange(v, 32 << 10, 64 << 10));
                }
            }
        }
        byte[] victim = Payloads.make("victim-of-parts", 3, 4096);
        assertThat(admin.put("victim-of-parts", victim)).isEqualTo(PutStatus.OK);
        try (FrameConnection m = FrameConnection.connect(master(), CALL, Limits.DEFAULT, DATA_ONLY)) {
            MasterMessages.ReplicaList where = MasterMessages.ReplicaListReply.read(m.call(Opcode.GET_REPLICA_LIST,
                    new BodyWriter().i32(1).bytes("victim-of-parts".getBytes()), CALL).body()).items().getFirst();
            BodyWriter w = new BodyWriter();
            new NodeMessages.Write(admin.stats().epoch(), 0, List.of(new NodeMessages.WriteItem(
                    where.replicas().getFirst().offset(), where.generation(), "victim-of-parts".getBytes(), 4096, 0,
                    WriteGrant.none()))).write(w);
            assertThat(refused(node(), DATA_ONLY, Opcode.NODE_PART_BEGIN, w).getMessage())
                    .contains("refuses a write without the admin secret");
        }
        assertThat(admin.get("victim-of-parts")).hasValueSatisfying(b -> assertThat(b).isEqualTo(victim));
    }

    @Test
    void theClusterSecretAloneCannotEmptyThePoolOrActAsTheMaster() throws Exception {
        try (KvPoolClient data = cluster.client(c -> c.withSecrets(DATA_ONLY))) {
            assertThatThrownBy(() -> data.removeAll(true)).isInstanceOf(KvPoolException.class)
                    .hasMessageContaining("remove_all needs the admin secret");
            assertThatThrownBy(() -> data.removeByPrefix("k")).isInstanceOf(KvPoolException.class)
                    .hasMessageContaining("needs the admin secret");
        }
        // nor reset a node, free its regions, or register a fake node with the master
        refused(node(), DATA_ONLY, Opcode.NODE_RESET, new BodyWriter().i64(1L << 62).i64(0));
        refused(node(), DATA_ONLY, Opcode.NODE_FREE, new BodyWriter().i64(0).i32(0));
        BodyWriter reg = new BodyWriter();
        new RegisterNode("10.6.6.6:1", "10.6.6.6", 1, 1 << 30, 0, 1, 0, "", ControlToken.random()).write(reg);
        refused(master(), DATA_ONLY, Opcode.REGISTER_NODE, reg);
        assertThat(admin.stats().segments()).hasSize(1);
        assertThat(admin.get("kept")).isPresent();
    }

    @Test
    void aWrongSecretIsRefusedWithoutShowingEitherSecret() throws Exception {
        Secrets wrong = Secrets.of("another-cluster-secret-entirely", null);
        AuthenticationException e = catchThrowableOfType(AuthenticationException.class,
                () -> FrameConnection.connect(master(), CALL, Limits.DEFAULT, wrong).close());
        assertThat(e).isNotNull();
        assertThat(e.getMessage()).contains(master().toString()).contains("did not prove it knows the cluster secret")
                .doesNotContain("another-cluster-secret").doesNotContain("secured-pool-it");
        // a client with the right cluster secret but a wrong admin secret is refused at the proof
        Secrets wrongAdmin = Secrets.of("cluster-secret-of-the-secured-pool-it", "not-the-admin-secret-at-all");
        AuthenticationException a = catchThrowableOfType(AuthenticationException.class,
                () -> FrameConnection.connect(node(), CALL, Limits.DEFAULT, wrongAdmin).close());
        assertThat(a.getMessage()).contains("refused this connection").contains("admin secret does not match");
        try (KvPoolClient c = cluster.client(cfg -> cfg.withSecrets(wrong))) {
            throw new AssertionError("connected with a wrong secret: " + c);
        } catch (KvPoolException expected) {
            assertThat(expected.getMessage()).contains("did not prove");
        }
    }

    @Test
    void aClientWithASecretRefusesAnOpenServer() throws Exception {
        try (InProcessCluster open = new InProcessCluster(1, Size.ofMiB(8))) {
            AuthenticationException e = catchThrowableOfType(AuthenticationException.class,
                    () -> FrameConnection.connect(HostPort.parse(open.masterAddress()), CALL, Limits.DEFAULT, BOTH).close());
            assertThat(e.getMessage()).contains("holds no cluster secret");
        }
    }

    @Test
    void theAdminSecretGrantsAdminAndAProofIsGoodForOneChallengeOnly() throws Exception {
        try (FrameConnection c = FrameConnection.connect(node(), CALL, Limits.DEFAULT, Secrets.NONE)) {
            // replaying a proof recorded from another exchange fails: the server's nonce is new each time
            c.call(Opcode.AUTH_BEGIN, new BodyWriter().bytes(new byte[32]), CALL);
            RemoteException e = catchThrowableOfType(RemoteException.class, () -> c.call(Opcode.AUTH_PROVE,
                    new BodyWriter().u8(Access.ADMIN.code).bytes(new byte[32]), CALL));
            assertThat(e.status()).isEqualTo(FrameStatus.UNAUTHORIZED);
        }
        try (FrameConnection c = FrameConnection.connect(node(), CALL, Limits.DEFAULT, BOTH)) {
            // the admin level passes the check for node administration (an empty NODE_FREE frees nothing),
            // with the control token the node gave its master (version 10)
            BodyWriter w = new BodyWriter();
            new NodeMessages.Free(0, cluster.nodes.getFirst().controlToken(), List.of()).write(w);
            assertThat(c.call(Opcode.NODE_FREE, w, CALL).header().status()).isEqualTo(FrameStatus.OK.code);
        }
        // the admin secret alone is not the master: without that token the node refuses to be administered
        BodyWriter guess = new BodyWriter();
        new NodeMessages.Free(0, ControlToken.random(), List.of()).write(guess);
        assertThat(refused(node(), BOTH, Opcode.NODE_FREE, guess).getMessage())
                .contains("only from the master it registered with");
        assertThat(admin.get("kept")).isPresent();
        assertThat(List.of(admin.put("after-admin", new byte[10]))).containsExactly(PutStatus.OK);
    }

    /** Tenants over HTTP on a secured master: reading them takes the cluster secret, changing them the admin secret. */
    @Test
    void tenantsAreReadWithTheClusterSecretAndChangedOnlyWithTheAdminSecret() throws Exception {
        java.net.http.HttpClient http = java.net.http.HttpClient.newHttpClient();
        String url = "http://127.0.0.1:" + cluster.master.httpPort() + "/api/tenants";
        String list = "{\"tenants\": [{\"name\": \"t\", \"prefixes\": [\"secured/\"], \"memory\": \"1MiB\"}]}";
        java.util.function.BiFunction<String, String, Integer> call = (method, bearer) -> {
            var b = java.net.http.HttpRequest.newBuilder(java.net.URI.create(url));
            if (bearer != null) {
                b.header("Authorization", "Bearer " + bearer);
            }
            b.method(method, method.equals("PUT") ? java.net.http.HttpRequest.BodyPublishers.ofString(list)
                    : java.net.http.HttpRequest.BodyPublishers.noBody());
            try {
                return http.send(b.build(), java.net.http.HttpResponse.BodyHandlers.discarding()).statusCode();
            } catch (Exception e) {
                throw new IllegalStateException(e);
            }
        };
        assertThat(call.apply("GET", null)).isEqualTo(401);
        assertThat(call.apply("GET", "cluster-secret-of-the-secured-pool-it")).isEqualTo(200);
        assertThat(call.apply("PUT", null)).isEqualTo(401);
        assertThat(call.apply("PUT", "cluster-secret-of-the-secured-pool-it")).as("the cluster secret").isEqualTo(401);
        assertThat(cluster.master.service().config().tenants()).isEmpty();
        assertThat(call.apply("PUT", "admin-secret-of-the-secured-pool-it")).isEqualTo(200);
    }
}
