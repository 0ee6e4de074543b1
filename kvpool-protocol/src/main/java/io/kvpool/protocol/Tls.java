package io.kvpool.protocol;

import io.kvpool.config.HostPort;

import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLEngine;
import javax.net.ssl.SSLParameters;
import javax.net.ssl.TrustManagerFactory;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.Signature;
import java.security.cert.CertificateException;
import java.security.cert.CertificateExpiredException;
import java.security.cert.CertificateFactory;
import java.security.cert.CertificateNotYetValidException;
import java.security.cert.X509Certificate;
import java.security.spec.InvalidKeySpecException;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * A process's TLS identity for kvpool connections (docs/security.md, "TLS"): its certificate chain,
 * its private key, and the CA bundle its peers are verified against, all PEM files. Off
 * ({@link #NONE}) unless all three are given.
 *
 * <h2>What is checked</h2>
 * TLS 1.3 only, mutual: a server requires a client certificate that chains to the CA bundle; a
 * client verifies the server's chain against the CA bundle <em>and</em> that the server's
 * certificate names the address the client dialed (an IP SAN for an IP address, a DNS SAN for a
 * name; the JDK's "HTTPS" endpoint identification). So a node's certificate lists every address
 * clients and the master reach it by: the address the master hands out is the one the node
 * advertises. Servers do not check client addresses (clients have none to check). There is no
 * revocation checking (no CRL or OCSP): to retire a certificate, replace the CA.
 *
 * <h2>Keys</h2>
 * Loaded with the JDK alone: the private key must be unencrypted PKCS#8 ({@code BEGIN PRIVATE KEY},
 * what {@code openssl genpkey} and {@code openssl req -newkey} write), RSA, EC or EdDSA. A PKCS#1
 * ({@code BEGIN RSA PRIVATE KEY}) or SEC1 ({@code BEGIN EC PRIVATE KEY}) key, or an encrypted one, is
 * refused with the openssl command that converts it. The key must match the first certificate of
 * the chain, which must be valid now. Every problem is an IllegalArgumentException naming the file,
 * raised when the process starts.
 */
public final class Tls {

    /** Environment variables naming the three PEM files (clients; servers read them too). */
    public static final String CERT_ENV = "KVPOOL_TLS_CERT";
    public static final String KEY_ENV = "KVPOOL_TLS_KEY";
    public static final String CA_ENV = "KVPOOL_TLS_CA";

    /** The only protocol offered or accepted. */
    static final String PROTOCOL = "TLSv1.3";

    /** TLS off: plain TCP. */
    public static final Tls NONE = new Tls(null, null, null, null);

    private static final Pattern PEM_BLOCK = Pattern.compile(
            "-----BEGIN ([A-Z0-9 ]+)-----([A-Za-z0-9+/=\\s]*)-----END \\1-----");

    private final Path cert;
    private final Path key;
    private final Path ca;
    private final SSLContext context;

    private Tls(Path cert, Path key, Path ca, SSLContext context) {
        this.cert = cert;
        this.key = key;
        this.ca = ca;
        this.context = context;
    }

    /**
     * Loads and checks the three files. IllegalArgumentException naming the file when one is missing,
     * unreadable, not PEM of the expected kind, expired, or when the key does not match the certificate.
     */
    public static Tls load(Path cert, Path key, Path ca) {
        List<X509Certificate> chain = certificates(cert, "certificate chain");
        List<X509Certificate> authorities = certificates(ca, "CA bundle");
        X509Certificate leaf = chain.getFirst();
        try {
            leaf.checkValidity();
        } catch (CertificateExpiredException e) {
            throw new IllegalArgumentException("the certificate in " + cert + " (" + subject(leaf) + ") expired on "
                    + leaf.getNotAfter().toInstant());
        } catch (CertificateNotYetValidException e) {
            throw new IllegalArgumentException("the certificate in " + cert + " (" + subject(leaf)
                    + ") is not valid before " + leaf.getNotBefore().toInstant());
        }
        PrivateKey pk = privateKey(key, leaf, cert);
        try {
            KeyStore ks = KeyStore.getInstance("PKCS12");
            ks.load(null, null);
            char[] none = new char[0];
            ks.setKeyEntry("kvpool", pk, none, chain.toArray(new X509Certificate[0]));
            KeyManagerFactory kmf = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
            kmf.init(ks, none);
            KeyStore trust = KeyStore.getInstance("PKCS12");
            trust.load(null, null);
            for (int i = 0; i < authorities.size(); i++) {
                trust.setCertificateEntry("ca-" + i, authorities.get(i));
            }
            TrustManagerFactory tmf = TrustManagerFactory.getInstance("PKIX");
            tmf.init(trust);
            SSLContext ctx = SSLContext.getInstance(PROTOCOL);
            ctx.init(kmf.getKeyManagers(), tmf.getTrustManagers(), null);
            return new Tls(cert, key, ca, ctx);
        } catch (GeneralSecurityException | IOException e) {
            throw new IllegalArgumentException("cannot set up TLS from " + cert + ", " + key + " and " + ca + ": "
                    + e.getMessage(), e);
        }
    }

    /**
     * TLS from {@link #CERT_ENV}, {@link #KEY_ENV} and {@link #CA_ENV}: {@link #NONE} when none is set;
     * IllegalArgumentException naming the missing ones when only some are.
     */
    public static Tls fromEnvironment() {
        return fromEnvironment(System.getenv());
    }

    static Tls fromEnvironment(Map<String, String> env) {
        return of(path(env.get(CERT_ENV)), path(env.get(KEY_ENV)), path(env.get(CA_ENV)), "env " + CERT_ENV, "env "
                + KEY_ENV, "env " + CA_ENV);
    }

    /**
     * {@link #NONE} when all three are null, {@link #load} when all three are given; otherwise an
     * IllegalArgumentException naming (with {@code names}, e.g. flags) the ones missing.
     */
    public static Tls of(Path cert, Path key, Path ca, String certName, String keyName, String caName) {
        if (cert == null && key == null && ca == null) {
            return NONE;
        }
        List<String> missing = new ArrayList<>();
        if (cert == null) {
            missing.add(certName);
        }
        if (key == null) {
            missing.add(keyName);
        }
        if (ca == null) {
            missing.add(caName);
        }
        if (!missing.isEmpty()) {
            throw new IllegalArgumentException("TLS needs a certificate chain, its private key and a CA bundle: "
                    + String.join(" and ", missing) + (missing.size() == 1 ? " is" : " are") + " missing");
        }
        return load(cert, key, ca);
    }

    private static Path path(String v) {
        return v == null || v.isBlank() ? null : Path.of(v.strip());
    }

    /** Whether connections use TLS. */
    public boolean enabled() {
        return context != null;
    }

    /** The certificate chain file (null when off). */
    public Path certFile() {
        return cert;
    }

    /** The private key file (null when off). */
    public Path keyFile() {
        return key;
    }

    /** The CA bundle file (null when off). */
    public Path caFile() {
        return ca;
    }

    /** An engine for a connection this process opens to {@code peer}, which must present a certificate for it. */
    SSLEngine clientEngine(HostPort peer) {
        SSLEngine e = context.createSSLEngine(peer.host(), peer.port());
        e.setUseClientMode(true);
        SSLParameters p = e.getSSLParameters();
        p.setProtocols(new String[]{PROTOCOL});
        p.setEndpointIdentificationAlgorithm("HTTPS");
        e.setSSLParameters(p);
        return e;
    }

    /** An engine for a connection this process accepted; the peer must present a certificate. */
    SSLEngine serverEngine() {
        SSLEngine e = context.createSSLEngine();
        e.setUseClientMode(false);
        SSLParameters p = e.getSSLParameters();
        p.setProtocols(new String[]{PROTOCOL});
        p.setNeedClientAuth(true);
        e.setSSLParameters(p);
        return e;
    }

    private static String read(Path file, String what) {
        try {
            return Files.readString(file, StandardCharsets.US_ASCII);
        } catch (IOException e) {
            throw new IllegalArgumentException("cannot read the TLS " + what + " file " + file + ": " + e, e);
        }
    }

    private static List<X509Certificate> certificates(Path file, String what) {
        String text = read(file, what);
        List<X509Certificate> out = new ArrayList<>();
        try {
            CertificateFactory f = CertificateFactory.getInstance("X.509");
            Matcher m = PEM_BLOCK.matcher(text);
            while (m.find()) {
                if (m.group(1).equals("CERTIFICATE")) {
                    byte[] der = Base64.getMimeDecoder().decode(m.group(2));
                    out.add((X509Certificate) f.generateCertificate(new ByteArrayInputStream(der)));
                }
            }
        } catch (CertificateException | IllegalArgumentException e) {
            throw new IllegalArgumentException("the TLS " + what + " file " + file + " holds a certificate that cannot"
                    + " be read: " + e.getMessage(), e);
        }
        if (out.isEmpty()) {
            throw new IllegalArgumentException("the TLS " + what + " file " + file + " holds no PEM certificate"
                    + " (-----BEGIN CERTIFICATE-----)");
        }
        return out;
    }

    private static PrivateKey privateKey(Path file, X509Certificate leaf, Path certFile) {
        String text = read(file, "private key");
        Matcher m = PEM_BLOCK.matcher(text);
        String convert = "; convert it with: openssl pkcs8 -topk8 -nocrypt -in " + file + " -out KEY.pem";
        while (m.find()) {
            String label = m.group(1);
            switch (label) {
                case "PRIVATE KEY" -> {
                    return pkcs8(file, Base64.getMimeDecoder().decode(m.group(2)), leaf, certFile);
                }
                case "ENCRYPTED PRIVATE KEY" -> throw new IllegalArgumentException("the TLS private key file " + file
                        + " is encrypted; kvpool reads unencrypted PKCS#8 keys (keep the file mode 0600)" + convert);
                case "RSA PRIVATE KEY", "EC PRIVATE KEY" -> throw new IllegalArgumentException("the TLS private key"
                        + " file " + file + " holds a " + label + " (PKCS#1/SEC1); kvpool reads PKCS#8 keys" + convert);
                default -> {
                    // another block (a certificate, parameters): keep looking
                }
            }
        }
        throw new IllegalArgumentException("the TLS private key file " + file + " holds no PEM private key"
                + " (-----BEGIN PRIVATE KEY-----)");
    }

    private static PrivateKey pkcs8(Path file, byte[] der, X509Certificate leaf, Path certFile) {
        String alg = leaf.getPublicKey().getAlgorithm();
        PrivateKey pk;
        try {
            pk = KeyFactory.getInstance(alg).generatePrivate(new PKCS8EncodedKeySpec(der));
        } catch (InvalidKeySpecException e) {
            throw new IllegalArgumentException("the TLS private key file " + file + " does not hold a PKCS#8 " + alg
                    + " key, the type of the certificate in " + certFile + ": " + e.getMessage(), e);
        } catch (GeneralSecurityException e) {
            throw new IllegalArgumentException("the certificate in " + certFile + " has a " + alg
                    + " key, which this JVM cannot use: " + e.getMessage(), e);
        }
        if (!matches(pk, leaf)) {
            throw new IllegalArgumentException("the TLS private key in " + file + " does not match the certificate in "
                    + certFile + " (" + subject(leaf) + ")");
        }
        return pk;
    }

    /** Whether {@code pk} is the private half of the certificate's key: a test signature verifies. */
    private static boolean matches(PrivateKey pk, X509Certificate leaf) {
        String sigAlg = switch (pk.getAlgorithm()) {
            case "RSA" -> "SHA256withRSA";
            case "EC" -> "SHA256withECDSA";
            case "EdDSA", "Ed25519", "Ed448" -> "EdDSA";
            default -> throw new IllegalArgumentException("TLS keys of type " + pk.getAlgorithm()
                    + " are not supported; use RSA, EC or EdDSA");
        };
        byte[] probe = "kvpool tls key check".getBytes(StandardCharsets.US_ASCII);
        try {
            Signature s = Signature.getInstance(sigAlg);
            s.initSign(pk);
            s.update(probe);
            byte[] sig = s.sign();
            Signature v = Signature.getInstance(sigAlg);
            v.initVerify(leaf.getPublicKey());
            v.update(probe);
            return v.verify(sig);
        } catch (GeneralSecurityException e) {
            return false;
        }
    }

    private static String subject(X509Certificate c) {
        return c.getSubjectX500Principal().getName();
    }

    @Override
    public String toString() {
        return enabled() ? "Tls[cert=" + cert + ", key=" + key + ", ca=" + ca + "]" : "Tls[off]";
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof Tls t && Objects.equals(cert, t.cert) && Objects.equals(key, t.key)
                && Objects.equals(ca, t.ca);
    }

    @Override
    public int hashCode() {
        return Objects.hash(cert, key, ca);
    }
}
