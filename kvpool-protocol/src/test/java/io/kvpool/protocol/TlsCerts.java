package io.kvpool.protocol;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;

/** Test certificates made by scripts/tls-certs.sh into a directory (see that script for the files). */
record TlsCerts(Path dir) {

    static TlsCerts make(Path dir, String... addresses) throws IOException, InterruptedException {
        Path script = Path.of("").toAbsolutePath();
        while (script != null && !Files.exists(script.resolve("scripts/tls-certs.sh"))) {
            script = script.getParent();
        }
        if (script == null) {
            throw new IllegalStateException("scripts/tls-certs.sh not found above " + Path.of("").toAbsolutePath());
        }
        String[] cmd = new String[2 + addresses.length];
        cmd[0] = script.resolve("scripts/tls-certs.sh").toString();
        cmd[1] = dir.toString();
        System.arraycopy(addresses, 0, cmd, 2, addresses.length);
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes());
        if (p.waitFor() != 0) {
            throw new IllegalStateException("tls-certs.sh failed: " + out);
        }
        return new TlsCerts(dir);
    }

    Path file(String name) {
        return dir.resolve(name);
    }

    Tls server() {
        return Tls.load(file("server.pem"), file("server.key"), file("ca.pem"));
    }

    Tls client() {
        return Tls.load(file("client.pem"), file("client.key"), file("ca.pem"));
    }
}
