package io.kvpool.protocol;

import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.security.SecureRandom;
import java.time.Duration;

/**
 * The authentication at the start of a connection (protocol version 8, docs/protocol.md 4.31): a
 * mutual challenge-response over HMAC-SHA256, so that neither secret crosses the wire and a recorded
 * exchange cannot be replayed (each side contributes a fresh random nonce).
 *
 * <pre>
 *   client                                         server
 *     AUTH_BEGIN  client nonce Nc (32 random bytes)  ->
 *              <-  mode (1: secured), server nonce Ns, server proof
 *                  server proof = HMAC(cluster secret, "kvpool auth v8 server" 0x00 Nc Ns)
 *     (the client checks the server proof: a server that does not know the secret is refused)
 *     AUTH_PROVE  level L (1 data, 2 admin), client proof  ->
 *                  client proof = HMAC(secret of L, "kvpool auth v8 client" 0x00 L Ns Nc)
 *              <-  level granted                       (or UNAUTHORIZED, and the connection closes)
 * </pre>
 *
 * A server without secrets answers AUTH_BEGIN with mode 0 (open) and grants everything; a client
 * that holds a secret refuses such a server, since anyone can run one.
 */
public final class Handshake {

    public static final int NONCE_BYTES = 32;
    public static final int PROOF_BYTES = 32;
    /** Most client nonce bytes AUTH_BEGIN may carry. */
    public static final int MAX_NONCE_BYTES = 64;
    /** AUTH_BEGIN reply mode: the server holds no secret, everything is allowed. */
    public static final int MODE_OPEN = 0;
    /** AUTH_BEGIN reply mode: the server holds the secrets and checks proofs. */
    public static final int MODE_SECURED = 1;

    private static final byte[] SERVER_LABEL = "kvpool auth v8 server".getBytes(StandardCharsets.US_ASCII);
    private static final byte[] CLIENT_LABEL = "kvpool auth v8 client".getBytes(StandardCharsets.US_ASCII);
    private static final SecureRandom RANDOM = new SecureRandom();

    private Handshake() {
    }

    static byte[] nonce() {
        byte[] n = new byte[NONCE_BYTES];
        RANDOM.nextBytes(n);
        return n;
    }

    /** HMAC-SHA256 of the parts, in order. */
    static byte[] hmac(byte[] key, byte[]... parts) {
        try {
            Mac mac = Mac.getInstance("HmacSHA256");
            mac.init(new SecretKeySpec(key, "HmacSHA256"));
            for (byte[] p : parts) {
                mac.update(p);
            }
            return mac.doFinal();
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException("HmacSHA256 is missing from this JVM", e);
        }
    }

    /**
     * The largest body {@code op} (AUTH_BEGIN or AUTH_PROVE) may carry: a server refuses a larger one
     * from its header, unread, since a peer that has not authenticated may make it hold no more.
     * AUTH_BEGIN: the nonce's u16 length and at most {@link #MAX_NONCE_BYTES}; AUTH_PROVE: the level,
     * the proof's u16 length and {@link #PROOF_BYTES}.
     */
    public static int maxBodyBytes(Opcode op) {
        return switch (op) {
            case AUTH_BEGIN -> 2 + MAX_NONCE_BYTES;
            case AUTH_PROVE -> 1 + 2 + PROOF_BYTES;
            default -> throw new IllegalArgumentException(op.metricName + " is not an authentication frame");
        };
    }

    /** The server's proof that it knows the cluster secret. */
    public static byte[] serverProof(byte[] clusterKey, byte[] clientNonce, byte[] serverNonce) {
        return hmac(clusterKey, SERVER_LABEL, new byte[]{0}, clientNonce, serverNonce);
    }

    /** The client's proof that it knows the secret of {@code level}. */
    public static byte[] clientProof(byte[] key, Access level, byte[] serverNonce, byte[] clientNonce) {
        return hmac(key, CLIENT_LABEL, new byte[]{0, (byte) level.code}, serverNonce, clientNonce);
    }

    /**
     * Authenticates a fresh connection with {@code secrets} (which must be {@link Secrets#present()}):
     * the level granted. AuthenticationException naming the peer when either side's proof fails.
     */
    public static Access authenticate(FrameConnection c, Secrets secrets, Duration timeout) throws IOException {
        byte[] cn = nonce();
        try {
            BodyReader r = c.call(Opcode.AUTH_BEGIN, new BodyWriter(48).bytes(cn), timeout).body();
            int mode = r.u8("mode");
            byte[] sn = r.bytes("server nonce");
            byte[] proof = r.bytes("server proof");
            r.end("auth_begin reply");
            if (mode == MODE_OPEN) {
                throw new AuthenticationException(c.peer() + " holds no cluster secret (an open server); this process"
                        + " has one and talks only to servers that prove they know it");
            }
            if (mode != MODE_SECURED || sn.length != NONCE_BYTES
                    || !MessageDigest.isEqual(proof, serverProof(secrets.key(Access.DATA), cn, sn))) {
                throw new AuthenticationException(c.peer() + " did not prove it knows the cluster secret: it holds"
                        + " another secret, or it is not a server of this pool");
            }
            Access level = secrets.level();
            BodyWriter w = new BodyWriter(48).u8(level.code).bytes(clientProof(secrets.key(level), level, sn, cn));
            BodyReader g = c.call(Opcode.AUTH_PROVE, w, timeout).body();
            Access granted = Access.of(g.u8("granted level"));
            g.end("auth_prove reply");
            return granted;
        } catch (RemoteException e) {
            throw new AuthenticationException(c.peer() + " refused this connection: " + e.getMessage());
        }
    }

    /**
     * The server's side for one connection: answers AUTH_BEGIN and AUTH_PROVE, and knows the level
     * proven. Not thread-safe (one per connection, on its thread).
     */
    public static final class ServerSide {
        private final Secrets secrets;
        private byte[] clientNonce;
        private byte[] serverNonce;
        private Access level;

        public ServerSide(Secrets secrets) {
            this.secrets = secrets;
            this.level = secrets.present() ? Access.NONE : Access.ADMIN;
        }

        /** What this connection has proven. */
        public Access level() {
            return level;
        }

        /** Serves AUTH_BEGIN or AUTH_PROVE; UnauthorizedException when the proof fails. */
        public void serve(Request req) throws IOException {
            BodyReader r = req.body();
            if (req.opcode() == Opcode.AUTH_BEGIN) {
                byte[] cn = r.bytes("client nonce");
                r.end("auth_begin");
                if (cn.length < 16 || cn.length > MAX_NONCE_BYTES) {
                    throw new BadRequestException("auth_begin client nonce of " + cn.length + " bytes; 16 to "
                            + MAX_NONCE_BYTES + " expected");
                }
                clientNonce = cn;
                serverNonce = nonce();
                BodyWriter w = new BodyWriter(80);
                if (secrets.present()) {
                    w.u8(MODE_SECURED).bytes(serverNonce).bytes(serverProof(secrets.key(Access.DATA), cn, serverNonce));
                } else {
                    w.u8(MODE_OPEN).bytes(serverNonce).bytes(new byte[0]);
                }
                req.reply(w);
                return;
            }
            Access asked = Access.of(r.u8("level"));
            byte[] proof = r.bytes("proof");
            r.end("auth_prove");
            if (!secrets.present()) {
                req.reply(new BodyWriter(1).u8(Access.ADMIN.code));
                return;
            }
            if (serverNonce == null) {
                throw new UnauthorizedException("auth_prove before auth_begin");
            }
            byte[] sn = serverNonce;
            serverNonce = null; // one proof per challenge
            if (asked == Access.NONE || (asked == Access.ADMIN && !secrets.hasAdmin())
                    || !MessageDigest.isEqual(proof, clientProof(secrets.key(asked), asked, sn, clientNonce))) {
                throw new UnauthorizedException("the proof for the " + (asked == Access.ADMIN ? "admin" : "cluster")
                        + " secret does not match this server's: check the secret files the client was given");
            }
            level = asked;
            req.reply(new BodyWriter(1).u8(asked.code));
        }
    }

    /** An authentication failure on the server: answered UNAUTHORIZED, and the connection is closed. */
    public static final class UnauthorizedException extends RuntimeException {
        public UnauthorizedException(String message) {
            super(message);
        }
    }
}
