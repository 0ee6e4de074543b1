package io.kvpool.protocol;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.Map;

/**
 * The pool's two secrets, as a process holds them: the cluster (data) secret every client, node and
 * master proves it knows when it connects, and the admin secret that destructive operations and node
 * administration need (docs/security.md). Either may be absent: a process without them talks only to
 * open servers, and a server without them is open (loopback only, unless the operator says
 * {@code --insecure}).
 *
 * <p>Secrets come from files or the environment, never from the command line (where {@code ps}
 * shows them): {@code KVPOOL_SECRET_FILE} / {@code KVPOOL_ADMIN_SECRET_FILE} name files, or
 * {@code KVPOOL_SECRET} / {@code KVPOOL_ADMIN_SECRET} hold the values. A file's content is the
 * secret with surrounding white space (a trailing newline) removed. A secret has at least
 * {@link #MIN_LENGTH} characters. {@link #toString()} never shows them.
 *
 * <p>They may also carry the process's TLS identity ({@link #tls()}, {@link Tls}): what a connection
 * presents and checks below the frames, before the secrets are proven over it. It travels with the
 * secrets because every connection that proves them (every role's, to masters and nodes) must use it
 * too. {@link #fromEnvironment()} reads it from {@code KVPOOL_TLS_CERT}, {@code KVPOOL_TLS_KEY} and
 * {@code KVPOOL_TLS_CA}.
 */
public final class Secrets {

    /** Fewest characters a secret may have. */
    public static final int MIN_LENGTH = 16;

    /** No secrets: for open (loopback) deployments. */
    public static final Secrets NONE = new Secrets(null, null, Tls.NONE);

    private final byte[] data;
    private final byte[] admin;
    private final Tls tls;

    private Secrets(byte[] data, byte[] admin, Tls tls) {
        this.data = data;
        this.admin = admin;
        this.tls = tls;
    }

    /**
     * Secrets from their values; {@code admin} may be null (a client that needs no destructive
     * operation). IllegalArgumentException naming which one is too short, or when only an admin secret is given.
     */
    public static Secrets of(String data, String admin) {
        if (data == null) {
            if (admin != null) {
                throw new IllegalArgumentException("an admin secret needs the cluster secret too");
            }
            return NONE;
        }
        return new Secrets(check("cluster secret", data), admin == null ? null : check("admin secret", admin), Tls.NONE);
    }

    private static byte[] check(String what, String value) {
        String v = value.strip();
        if (v.length() < MIN_LENGTH) {
            throw new IllegalArgumentException("the " + what + " has " + v.length() + " characters; it needs at least "
                    + MIN_LENGTH + " (for example: head -c 32 /dev/urandom | base64 > FILE)");
        }
        return v.getBytes(StandardCharsets.UTF_8);
    }

    /** Reads a secret file: IllegalArgumentException naming the file when it cannot be read. */
    public static String readFile(Path file, String what) {
        try {
            return Files.readString(file);
        } catch (IOException e) {
            throw new IllegalArgumentException("cannot read the " + what + " file " + file + ": " + e.getMessage(), e);
        }
    }

    /**
     * The secrets the environment names ({@code KVPOOL_SECRET_FILE}, {@code KVPOOL_SECRET}, and the
     * admin ones), with the TLS identity it names ({@link Tls#fromEnvironment()}).
     */
    public static Secrets fromEnvironment() {
        return fromEnvironment(System.getenv());
    }

    static Secrets fromEnvironment(Map<String, String> env) {
        return of(one(env, "KVPOOL_SECRET", "cluster secret"), one(env, "KVPOOL_ADMIN_SECRET", "admin secret"))
                .withTls(Tls.fromEnvironment(env));
    }

    /** These secrets with {@code t} as the TLS identity ({@link Tls#NONE}: plain TCP). */
    public Secrets withTls(Tls t) {
        if (t == null) {
            throw new IllegalArgumentException("tls must not be null (Tls.NONE for plain TCP)");
        }
        return data == null && t == Tls.NONE ? NONE : new Secrets(data, admin, t);
    }

    /** The TLS identity connections use ({@link Tls#NONE}: plain TCP). */
    public Tls tls() {
        return tls;
    }

    private static String one(Map<String, String> env, String name, String what) {
        String file = env.get(name + "_FILE");
        String value = env.get(name);
        if (file != null && !file.isBlank() && value != null) {
            throw new IllegalArgumentException("both " + name + "_FILE and " + name + " are set; set one");
        }
        if (file != null && !file.isBlank()) {
            return readFile(Path.of(file), what);
        }
        return value;
    }

    /** Whether a cluster secret is held (then connections authenticate). */
    public boolean present() {
        return data != null;
    }

    /** Whether the admin secret is held. */
    public boolean hasAdmin() {
        return admin != null;
    }

    /**
     * Whether {@code token} is the cluster secret (compared in constant time): the bearer token of the master's
     * HTTP lookups when it is secured. False when no secret is held.
     */
    public boolean isClusterSecret(String token) {
        return data != null && token != null
                && java.security.MessageDigest.isEqual(data, token.strip().getBytes(StandardCharsets.UTF_8));
    }

    /** Whether {@code token} is the admin secret (constant time): the bearer token of the master's HTTP changes. */
    public boolean isAdminSecret(String token) {
        return admin != null && token != null
                && java.security.MessageDigest.isEqual(admin, token.strip().getBytes(StandardCharsets.UTF_8));
    }

    /** The level these secrets can prove: ADMIN with the admin secret, DATA with the cluster secret alone. */
    public Access level() {
        return admin != null ? Access.ADMIN : data != null ? Access.DATA : Access.NONE;
    }

    /** The key for a level's proofs (package use: {@link Handshake}). */
    byte[] key(Access level) {
        byte[] k = level == Access.ADMIN ? admin : data;
        if (k == null) {
            throw new IllegalStateException("no secret for level " + level);
        }
        return k;
    }

    @Override
    public String toString() {
        return "Secrets[" + (data == null ? "none" : admin == null ? "cluster" : "cluster, admin")
                + (tls.enabled() ? ", tls" : "") + "]";
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof Secrets s && Arrays.equals(data, s.data) && Arrays.equals(admin, s.admin)
                && tls.equals(s.tls);
    }

    @Override
    public int hashCode() {
        return (Arrays.hashCode(data) * 31 + Arrays.hashCode(admin)) * 31 + tls.hashCode();
    }
}
