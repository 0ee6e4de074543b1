package io.kvpool.protocol;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** Where secrets come from, what is refused, and that they never show. */
class SecretsTest {

    private static final String DATA = "a-cluster-secret-of-some-length";
    private static final String ADMIN = "an-admin-secret-of-some-length";

    @Test
    void levelsFollowWhatIsHeld() {
        assertThat(Secrets.NONE.level()).isEqualTo(Access.NONE);
        assertThat(Secrets.of(DATA, null).level()).isEqualTo(Access.DATA);
        assertThat(Secrets.of(DATA, ADMIN).level()).isEqualTo(Access.ADMIN);
        assertThat(Secrets.of(null, null)).isSameAs(Secrets.NONE);
        assertThat(Access.ADMIN.allows(Access.DATA)).isTrue();
        assertThat(Access.DATA.allows(Access.ADMIN)).isFalse();
    }

    @Test
    void shortSecretsAndAnAdminSecretAloneAreRefusedWithoutShowingThem() {
        assertThatThrownBy(() -> Secrets.of("fifteen-chars!!", null)).hasMessageContaining("has 15 characters")
                .hasMessageContaining("at least 16").hasMessageNotContaining("fifteen-chars");
        assertThatThrownBy(() -> Secrets.of(null, ADMIN)).hasMessageContaining("needs the cluster secret");
        assertThat(Secrets.of(DATA, ADMIN).toString()).doesNotContain(DATA).doesNotContain(ADMIN);
    }

    @Test
    void theEnvironmentNamesFilesOrValuesButNotBoth(@TempDir Path dir) throws Exception {
        Path data = Files.writeString(dir.resolve("c"), "  " + DATA + "\n");
        Path admin = Files.writeString(dir.resolve("a"), ADMIN + "\n");
        Secrets fromFiles = Secrets.fromEnvironment(Map.of("KVPOOL_SECRET_FILE", data.toString(),
                "KVPOOL_ADMIN_SECRET_FILE", admin.toString()));
        assertThat(fromFiles).isEqualTo(Secrets.of(DATA, ADMIN)); // white space around a file's secret is dropped
        assertThat(Secrets.fromEnvironment(Map.of("KVPOOL_SECRET", DATA))).isEqualTo(Secrets.of(DATA, null));
        assertThat(Secrets.fromEnvironment(Map.of())).isSameAs(Secrets.NONE);
        assertThatThrownBy(() -> Secrets.fromEnvironment(Map.of("KVPOOL_SECRET_FILE", data.toString(),
                "KVPOOL_SECRET", DATA))).hasMessageContaining("both KVPOOL_SECRET_FILE and KVPOOL_SECRET");
        assertThatThrownBy(() -> Secrets.fromEnvironment(Map.of("KVPOOL_SECRET_FILE", dir.resolve("none").toString())))
                .hasMessageContaining("cannot read the cluster secret file").hasMessageContaining("none");
    }

    @Test
    void proofsDependOnEveryInput() {
        byte[] k = DATA.getBytes();
        byte[] a = new byte[32];
        byte[] b = new byte[32];
        b[0] = 1;
        assertThat(Handshake.serverProof(k, a, b)).hasSize(32).isNotEqualTo(Handshake.serverProof(k, b, a));
        assertThat(Handshake.clientProof(k, Access.DATA, a, b)).isNotEqualTo(Handshake.clientProof(k, Access.ADMIN, a, b));
        assertThat(Handshake.clientProof(k, Access.DATA, a, b)).isNotEqualTo(Handshake.serverProof(k, b, a));
        assertThat(Handshake.clientProof(k, Access.DATA, a, b))
                .isNotEqualTo(Handshake.clientProof(ADMIN.getBytes(), Access.DATA, a, b));
    }
}
