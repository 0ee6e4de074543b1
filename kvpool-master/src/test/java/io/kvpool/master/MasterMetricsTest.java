package io.kvpool.master;

import io.prometheus.metrics.model.snapshots.GaugeSnapshot;
import io.prometheus.metrics.model.snapshots.MetricSnapshot;
import org.junit.jupiter.api.Test;

import java.util.SplittableRandom;

import static org.assertj.core.api.Assertions.assertThat;

class MasterMetricsTest {

    private static double gauge(MasterMetrics m, String name) {
        for (MetricSnapshot s : m.registry().scrape()) {
            if (s.getMetadata().getName().equals(name)) {
                return ((GaugeSnapshot) s).getDataPoints().getFirst().getValue();
            }
        }
        throw new AssertionError("no gauge " + name);
    }

    @Test
    void leadershipGaugesFollowTheTermAndWhetherThisMasterServes() {
        MasterService svc = new MasterService(MasterConfig.defaults(), new ManualClock(1_700_000_000_000L),
                new SplittableRandom(1), NodeNotifier.NONE);
        MasterMetrics m = new MasterMetrics(svc);
        java.util.concurrent.atomic.AtomicBoolean leading = new java.util.concurrent.atomic.AtomicBoolean(true);
        m.leadership(7, leading::get);
        assertThat(gauge(m, "master_term")).isEqualTo(7);
        assertThat(gauge(m, "master_leader")).isEqualTo(1);
        leading.set(false);
        assertThat(gauge(m, "master_leader")).isEqualTo(0);
        // names promtool accepts: a gauge does not end in _count
        assertThat(gauge(m, "master_objects")).isEqualTo(0);
    }
}
