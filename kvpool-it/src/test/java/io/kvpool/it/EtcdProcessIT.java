package io.kvpool.it;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.opentest4j.TestAbortedException;

import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayDeque;
import java.util.Deque;
import java.util.List;
import java.util.Map;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;
import static org.assertj.core.api.Assertions.catchThrowable;

/**
 * How the HA tests' etcd ({@link EtcdProcess} over scripts/etcd.sh) treats what can go wrong: only an
 * etcd that cannot be installed here skips a test; an etcd that is present but crashes, never answers
 * or is not an executable fails it, naming the cause with the tail of etcd's log; a port taken by
 * someone else is not etcd's fault and is answered with other ports.
 */
class EtcdProcessIT {

    /** Ports handed out in order: the given ones first, then free ones. */
    private static EtcdProcess.Ports portsStartingWith(int... first) {
        Deque<Integer> queue = new ArrayDeque<>();
        for (int p : first) {
            queue.add(p);
        }
        return () -> queue.isEmpty() ? ProcessCluster.freePort() : queue.poll();
    }

    private static String health(EtcdProcess etcd) throws Exception {
        try (HttpClient http = HttpClient.newHttpClient()) {
            return http.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + etcd.clientPort() + "/health"))
                    .build(), HttpResponse.BodyHandlers.ofString()).body();
        }
    }

    @Test
    void aClientPortSomeoneListensOnIsAnsweredWithOtherPorts(@TempDir Path dir) throws Exception {
        try (ServerSocket taken = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
             EtcdProcess etcd = new EtcdProcess(dir.resolve("etcd"), EtcdProcess.SCRIPT, Map.of(),
                     portsStartingWith(taken.getLocalPort()))) {
            etcd.start();
            assertThat(etcd.clientPort()).isNotEqualTo(taken.getLocalPort());
            assertThat(health(etcd)).contains("\"health\":\"true\"");
            // a restart keeps its ports (its data names them)
            int port = etcd.clientPort();
            etcd.stop();
            etcd.start();
            assertThat(etcd.clientPort()).isEqualTo(port);
            assertThat(health(etcd)).contains("\"health\":\"true\"");
        }
    }

    @Test
    void aPeerPortBoundButNotListenedOnMakesEtcdFailToBindAndIsAnsweredWithOtherPorts(@TempDir Path dir)
            throws Exception {
        // bound without listening: the script's check that nothing answers passes, and etcd's own bind fails
        try (Socket taken = new Socket()) {
            taken.bind(new InetSocketAddress("127.0.0.1", 0));
            try (EtcdProcess etcd = new EtcdProcess(dir.resolve("etcd"), EtcdProcess.SCRIPT, Map.of(),
                    portsStartingWith(ProcessCluster.freePort(), taken.getLocalPort()))) {
                etcd.start();
                assertThat(health(etcd)).contains("\"health\":\"true\"");
                assertThat(Files.readString(dir.resolve("etcd").resolve("etcd.log")))
                        .as("the first attempt met the taken port").contains("address already in use");
            }
        }
    }

    @Test
    void portsTakenAtEveryAttemptFailTheTestNamingThem(@TempDir Path dir) throws Exception {
        try (ServerSocket taken = new ServerSocket(0, 50, InetAddress.getLoopbackAddress())) {
            int port = taken.getLocalPort();
            int[] handedOut = {0};
            // every client port is the taken one, every peer port a free one
            EtcdProcess.Ports ports = () -> handedOut[0]++ % 2 == 0 ? port : ProcessCluster.freePort();
            try (EtcdProcess etcd = new EtcdProcess(dir.resolve("etcd"), EtcdProcess.SCRIPT, Map.of(), ports)) {
                Throwable t = catchThrowable(etcd::start);
                assertThat(t).as("a failure, not a skip").isExactlyInstanceOf(AssertionError.class)
                        .hasMessageContaining("ports were taken " + EtcdProcess.PORT_ATTEMPTS + " times")
                        .hasMessageContaining("port " + port + " on 127.0.0.1 is already in use");
            }
            assertThat(handedOut[0]).isEqualTo(2 * EtcdProcess.PORT_ATTEMPTS);
        }
    }

    @Test
    void anEtcdThatCrashesAtStartFailsTheTestWithItsLog(@TempDir Path dir) throws Exception {
        try (EtcdProcess etcd = new EtcdProcess(dir.resolve("etcd"), EtcdProcess.SCRIPT,
                Map.of("ETCD_EXTRA_ARGS", "--no-such-flag-kvpool-it"), ProcessCluster::freePort)) {
            Throwable t = catchThrowable(etcd::start);
            assertThat(t).as("a failure, not a skip").isExactlyInstanceOf(AssertionError.class)
                    .hasMessageContaining("exit 1").hasMessageContaining("exited during startup")
                    .hasMessageContaining("last lines of") // the tail of etcd's log, with etcd's own complaint
                    .hasMessageContaining("flag provided but not defined: -no-such-flag-kvpool-it");
        }
    }

    @Test
    void anEtcdThatNeverAnswersFailsTheTestAndIsStopped(@TempDir Path dir) throws Exception {
        Path fake = dir.resolve("silent-etcd");
        Files.writeString(fake, "#!/bin/bash\necho 'silent etcd up, answering nothing'\nexec sleep 600\n");
        Files.setPosixFilePermissions(fake, PosixFilePermissions.fromString("rwx------"));
        try (EtcdProcess etcd = new EtcdProcess(dir.resolve("etcd"), EtcdProcess.SCRIPT,
                Map.of("ETCD_BIN", fake.toString(), "ETCD_START_TIMEOUT", "2"), ProcessCluster::freePort)) {
            Throwable t = catchThrowable(etcd::start);
            assertThat(t).isExactlyInstanceOf(AssertionError.class)
                    .hasMessageContaining("did not answer /health as healthy within 2s")
                    .hasMessageContaining("silent etcd up, answering nothing");
        }
        // the script stopped it: nothing runs with its data directory
        String data = dir.resolve("etcd").resolve("data").toString();
        assertThat(ProcessHandle.allProcesses().filter(p -> p.info().arguments().map(a -> List.of(a).contains(data))
                .orElse(false))).isEmpty();
    }

    @Test
    void anEtcdPathThatIsNoExecutableFailsTheTestNamingIt(@TempDir Path dir) throws Exception {
        Path missing = dir.resolve("no-such-etcd");
        try (EtcdProcess etcd = new EtcdProcess(dir.resolve("etcd"), EtcdProcess.SCRIPT,
                Map.of("ETCD_BIN", missing.toString()), ProcessCluster::freePort)) {
            assertThatThrownBy(etcd::start).isExactlyInstanceOf(AssertionError.class)
                    .hasMessageContaining("ETCD_BIN=" + missing + " is not an executable file");
        }
    }

    @Test
    void onlyAnEtcdThatCannotBeInstalledSkipsSayingWhy(@TempDir Path dir) throws Exception {
        // a PATH with neither etcd nor apt-get (only what the script needs to get that far): the script's
        // real install path says etcd cannot be had here
        Path bin = Files.createDirectories(dir.resolve("bin"));
        for (String tool : List.of("dirname", "basename")) {
            Files.createSymbolicLink(bin.resolve(tool), Path.of("/usr/bin", tool));
        }
        // (not closed: its stop would run with that PATH too, and nothing started)
        EtcdProcess etcd = new EtcdProcess(dir.resolve("etcd"), EtcdProcess.SCRIPT, Map.of("PATH", bin.toString()),
                ProcessCluster::freePort);
        assertThatThrownBy(etcd::start).isInstanceOf(TestAbortedException.class)
                .hasMessageContaining("etcd cannot be installed here")
                .hasMessageContaining("apt-get is not available");
    }
}
