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
    void heapGaugesReportTheJvmHeap() {
        MasterService svc = new MasterService(MasterConfig.defaults(), new ManualClock(1_700_000_000_000L),
                new SplittableRandom(1), NodeNotifier.NONE);
        MasterMetrics m = new MasterMetrics(svc);
        double used = gauge(m, "master_heap_used_bytes");
        double committed = gauge(m, "master_heap_committed_bytes");
        assertThat(used).isPositive();
        assertThat(committed).isGreaterThanOrEqualTo(used);
    }
}
