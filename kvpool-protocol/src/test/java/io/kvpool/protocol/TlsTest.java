package io.kvpool.protocol;

import io.kvpool.config.HostPort;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLSocket;
import javax.net.ssl.TrustManagerFactory;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.lang.foreign.MemorySegment;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyStore;
import java.security.cert.CertificateFactory;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Random;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * TLS under the frames: loading the PEM files (every error names the file), and a {@link FrameServer}
 * and {@link FrameConnection} in mutual TLS with secrets, byte-exact; clients that are refused (no
 * certificate, another CA, plain TCP, a server whose certificate does not name the address dialed)
 * get errors saying why, and the server counts them. The timeout only bounds a hang.
 */
@Timeout(60)
class TlsTest {

    private static final Duration CALL = Duration.ofSeconds(20);
    private static final String DATA = "data-secret-0123456789";
    private static final String ADMIN = "admin-secret-0123456789";

    @TempDir
    static Path dir;
    private static TlsCerts certs;
    private final List<AutoCloseable> toClose = new ArrayList<>();

    @BeforeAll
    static void makeCertificates() throws Exception {
        certs = TlsCerts.make(dir.resolve("certs"));
    }

    @AfterEach
    void close() throws Exception {
        for (AutoCloseable c : toClose.reversed()) {
            c.close();
        }
    }

    /** PING echoes its string; PUT_START echoes its payload. */
    private static void handle(Request req) throws IOException {
        switch (req.opcode()) {
            case PING -> req.reply(new BodyWriter().string(req.body().string("text")));
            case PUT_START -> {
                byte[] payload = new byte[(int) req.payloadLength()];
                req.readPayload(MemorySegment.ofArray(payload));
                req.reply(new BodyWriter(), ByteBuffer.wrap(payload));
            }
            default -> throw new AssertionError("unexpected " + req.opcode());
        }
    }

    private FrameServer server(String bind, Secrets secrets) throws IOException {
        FrameServer s = new FrameServer("test", new InetSocketAddress(InetAddress.getByName(bind), 0), Limits.DEFAULT,
                Duration.ofSeconds(20), op -> true, TlsTest::handle, secrets, op -> Access.DATA);
        toClose.add(s);
        return s;
    }

    private FrameConnection connect(String host, FrameServer s, Secrets secrets) throws IOException {
        FrameConnection c = FrameConnection.connect(new HostPort(host, s.port()), CALL, Limits.DEFAULT, secrets);
        toClose.add(c);
        return c;
    }

    private static Secrets secured(Tls tls) {
        return Secrets.of(DATA, ADMIN).withTls(tls);
    }

    @Test
    void mutualTlsWithSecretsCarriesFramesAndPayloadsByteExact() throws Exception {
        FrameServer s = server("127.0.0.1", secured(certs.server()));
        assertThat(s.tls()).isTrue();
        for (String host : List.of("127.0.0.1", "localhost")) { // an IP SAN and a DNS SAN
            FrameConnection c = connect(host, s, Secrets.of(DATA, null).withTls(certs.client()));
            assertThat(c.call(Opcode.PING, new BodyWriter().string("over tls"), CALL).body().string("text"))
                    .isEqualTo("over tls");
            for (int size : new int[]{1, 100, 16 << 10, (16 << 10) + 1, 3 << 20}) {
                byte[] value = new byte[size];
                new Random(size).nextBytes(value);
                FrameConnection.Reply r = c.call(Opcode.PUT_START, new BodyWriter(), CALL, ByteBuffer.wrap(value));
                byte[] back = new byte[(int) r.payloadLength()];
                c.readPayload(MemorySegment.ofArray(back), CALL);
                assertThat(back).isEqualTo(value);
            }
        }
        assertThat(s.tlsHandshakeFailures()).isZero();
        assertThat(s.refusedAuth()).isZero();
    }

    @Test
    void aPlainClientOfATlsServerIsToldTlsIsRequired() throws Exception {
        FrameServer s = server("127.0.0.1", secured(certs.server()));
        assertThatThrownBy(() -> connect("127.0.0.1", s, Secrets.of(DATA, ADMIN)).call(Opcode.PING,
                new BodyWriter().string("x"), CALL))
                .hasMessageContaining("requires TLS and this connection is plain TCP")
                .hasMessageContaining("KVPOOL_TLS_CERT");
        assertThat(s.tlsHandshakeFailures()).isEqualTo(1);
        // and the server goes on serving good clients
        assertThat(connect("127.0.0.1", s, secured(certs.client())).call(Opcode.PING, new BodyWriter().string("ok"),
                CALL).body().string("text")).isEqualTo("ok");
    }

    @Test
    void aTlsClientOfAPlainServerIsToldTheServerHasNoTls() throws Exception {
        FrameServer s = server("127.0.0.1", Secrets.of(DATA, ADMIN));
        assertThatThrownBy(() -> connect("127.0.0.1", s, secured(certs.client())))
                .hasMessageContaining("answered in plain TCP, not TLS");
        assertThat(s.tlsHandshakeFailures()).isEqualTo(1);
    }

    @Test
    void aClientCertificateOfAnotherCaIsRefused() throws Exception {
        FrameServer s = server("127.0.0.1", secured(certs.server()));
        Tls other = Tls.load(certs.file("other-client.pem"), certs.file("other-client.key"), certs.file("ca.pem"));
        assertThatThrownBy(() -> connect("127.0.0.1", s, secured(other)).call(Opcode.PING,
                new BodyWriter().string("x"), CALL))
                .hasMessageContaining("TLS with 127.0.0.1:" + s.port() + " failed");
        awaitFailures(s, 1);
    }

    @Test
    void aClientWithoutACertificateIsRefused() throws Exception {
        FrameServer s = server("127.0.0.1", secured(certs.server()));
        KeyStore trust = KeyStore.getInstance("PKCS12");
        trust.load(null, null);
        try (InputStream in = Files.newInputStream(certs.file("ca.pem"))) {
            trust.setCertificateEntry("ca", CertificateFactory.getInstance("X.509").generateCertificate(in));
        }
        TrustManagerFactory tmf = TrustManagerFactory.getInstance("PKIX");
        tmf.init(trust);
        SSLContext ctx = SSLContext.getInstance("TLSv1.3");
        ctx.init(null, tmf.getTrustManagers(), null);
        try (SSLSocket sock = (SSLSocket) ctx.getSocketFactory().createSocket("127.0.0.1", s.port())) {
            sock.setSoTimeout((int) CALL.toMillis());
            OutputStream out = sock.getOutputStream();
            ByteBuffer h = FrameHeader.write(FrameHeader.allocate(), Opcode.PING.code, false, 0, 1, 0, 0);
            byte[] bytes = new byte[h.remaining()];
            h.get(bytes);
            assertThatThrownBy(() -> {
                out.write(bytes);
                out.flush();
                sock.getInputStream().read();
            }).hasMessageContaining("certificate_required");
        }
        awaitFailures(s, 1);
    }

    @Test
    void aServerWhoseCertificateDoesNotNameTheAddressDialedIsRefused() throws Exception {
        FrameServer s = server("127.0.0.2", secured(certs.server())); // the certificate names 127.0.0.1 and localhost
        assertThatThrownBy(() -> connect("127.0.0.2", s, secured(certs.client())))
                .hasMessageContaining("127.0.0.2")
                .hasMessageContaining("subject alternative name");
    }

    @Test
    void aServerOfAnotherCaIsRefusedByTheClient() throws Exception {
        FrameServer s = server("127.0.0.1", secured(certs.server()));
        Tls trustsOther = Tls.load(certs.file("client.pem"), certs.file("client.key"), certs.file("other-ca.pem"));
        assertThatThrownBy(() -> connect("127.0.0.1", s, secured(trustsOther)))
                .hasMessageContaining("not signed by a CA in the other side's CA bundle");
        awaitFailures(s, 1);
    }

    private static void awaitFailures(FrameServer s, long n) throws InterruptedException {
        // the server counts after the client saw the alert: wait for it, bounded by the class timeout
        while (s.tlsHandshakeFailures() < n) {
            Thread.sleep(10);
        }
        assertThat(s.tlsHandshakeFailures()).isEqualTo(n);
    }

    @Test
    void badFilesFailAtLoadNamingTheFile() throws Exception {
        Path missing = dir.resolve("nope.pem");
        assertThatThrownBy(() -> Tls.load(missing, certs.file("server.key"), certs.file("ca.pem")))
                .hasMessageContaining("cannot read the TLS certificate chain file " + missing);
        assertThatThrownBy(() -> Tls.load(certs.file("server.pem"), certs.file("client.key"), certs.file("ca.pem")))
                .hasMessageContaining("private key in " + certs.file("client.key") + " does not match the certificate in "
                        + certs.file("server.pem"));
        assertThatThrownBy(() -> Tls.load(certs.file("server.key"), certs.file("server.key"), certs.file("ca.pem")))
                .hasMessageContaining(certs.file("server.key") + " holds no PEM certificate");
        assertThatThrownBy(() -> Tls.load(certs.file("server.pem"), certs.file("server.pem"), certs.file("ca.pem")))
                .hasMessageContaining(certs.file("server.pem") + " holds no PEM private key");
        Path sec1 = Files.writeString(dir.resolve("sec1.key"), "-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n");
        assertThatThrownBy(() -> Tls.load(certs.file("server.pem"), sec1, certs.file("ca.pem")))
                .hasMessageContaining(sec1.toString()).hasMessageContaining("openssl pkcs8 -topk8 -nocrypt");
        Path garbled = Files.writeString(dir.resolve("garbled.pem"), "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
        assertThatThrownBy(() -> Tls.load(certs.file("server.pem"), certs.file("server.key"), garbled))
                .hasMessageContaining("CA bundle file " + garbled + " holds a certificate that cannot be read");
        assertThatThrownBy(() -> Tls.fromEnvironment(Map.of(Tls.CERT_ENV, certs.file("client.pem").toString())))
                .hasMessageContaining("env KVPOOL_TLS_KEY and env KVPOOL_TLS_CA are missing");
        assertThat(Tls.fromEnvironment(Map.of())).isSameAs(Tls.NONE);
        Tls fromEnv = Tls.fromEnvironment(Map.of(Tls.CERT_ENV, certs.file("client.pem").toString(),
                Tls.KEY_ENV, certs.file("client.key").toString(), Tls.CA_ENV, certs.file("ca.pem").toString()));
        assertThat(fromEnv.enabled()).isTrue();
        assertThat(Secrets.fromEnvironment(Map.of(Tls.CERT_ENV, certs.file("client.pem").toString(),
                Tls.KEY_ENV, certs.file("client.key").toString(), Tls.CA_ENV, certs.file("ca.pem").toString())).tls())
                .isEqualTo(fromEnv);
        assertThat(secured(fromEnv).toString()).contains("tls").doesNotContain(DATA);
    }
}
