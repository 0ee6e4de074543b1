package io.kvpool.master;

import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.ControlToken;
import io.kvpool.protocol.msg.DigestList;
import io.kvpool.protocol.msg.MasterMessages.Inventory;
import io.kvpool.protocol.msg.MasterMessages.PutEndItem;
import io.kvpool.protocol.msg.MasterMessages.PutStart;
import io.kvpool.protocol.msg.MasterMessages.PutStartItem;
import io.kvpool.protocol.msg.MasterMessages.PutStartReply;
import io.kvpool.protocol.msg.MasterMessages.PutStartResult;
import io.kvpool.protocol.msg.MasterMessages.RegisterNode;
import io.kvpool.protocol.msg.MasterMessages.RegisterReply;
import io.kvpool.protocol.msg.MasterMessages.ReplicaList;
import io.kvpool.protocol.msg.Replica;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.SplittableRandom;
import java.util.stream.Stream;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The index as {@link MasterService} drives it, against a reference model: batches of puts
 * (with repeated keys, upserts, failed replicas, revokes and puts left pending), removals, probes and
 * reads, removal by prefix, with hashes squeezed so keys collide in shards and in hash values. Also
 * the shard-grouped batch visit of {@link ObjectIndex#forEachKey}. Failures name the seed.
 */
class IndexModelTest {

    private record Obj(long valueLength, long generation, List<Replica> replicas) {
    }

    static Stream<Arguments> runs() {
        List<Arguments> out = new ArrayList<>();
        // real hashes; one shard with four hashes; 64 shards with two hashes each; one hash for everything
        for (int mask : new int[]{-1, 0x3, 0xFC00_0001, 0}) {
            for (long seed = 1; seed <= 8; seed++) {
                out.add(Arguments.of(seed * 104_729 + mask, mask));
            }
        }
        return out.stream();
    }

    @ParameterizedTest(name = "seed {0}, hash mask {1}")
    @MethodSource("runs")
    void masterServiceBehavesLikeTheModel(long seed, int hashMask) {
        SplittableRandom rnd = new SplittableRandom(seed);
        ManualClock clock = new ManualClock(1_700_000_000_000L);
        MasterService svc = new MasterService(MasterConfig.defaults(), clock, new SplittableRandom(seed), NodeNotifier.NONE,
                new ObjectIndex(hashMask));
        for (int i = 1; i <= 3; i++) {
            RegisterReply r = svc.membership().registerNode(new RegisterNode("n" + i + ":1", "10.0.0." + i, 1, 1L << 32, svc.epoch(), i, 0, "", ControlToken.random()));
            svc.membership().inventory(new Inventory(r.segmentId(), i, true, List.of()));
        }
        List<byte[]> keys = keys(rnd, 250);
        Map<String, Obj> complete = new HashMap<>();
        Map<String, Obj> pending = new HashMap<>();
        for (int step = 0; step < 1500; step++) {
            String at = "seed " + seed + ", hash mask " + Integer.toHexString(hashMask) + ", step " + step;
            int op = rnd.nextInt(100);
            List<byte[]> batch = new ArrayList<>();
            int n = 1 + rnd.nextInt(rnd.nextBoolean() ? 4 : 80);
            for (int i = 0; i < n; i++) {
                // repeats within a batch on purpose
                batch.add(i > 0 && rnd.nextInt(8) == 0 ? batch.get(rnd.nextInt(i)) : keys.get(rnd.nextInt(keys.size())));
            }
            if (op < 35) {
                boolean upsert = rnd.nextInt(4) == 0;
                int replicas = 1 + rnd.nextInt(3);
                List<PutStartItem> items = new ArrayList<>();
                for (byte[] k : batch) {
                    items.add(new PutStartItem(k, rnd.nextInt(1, 1 << 16)));
                }
                PutStartReply reply = svc.putStart(new PutStart(upsert, replicas, "", items));
                List<PutEndItem> ends = new ArrayList<>();
                List<PutEndItem> revokes = new ArrayList<>();
                for (int i = 0; i < items.size(); i++) {
                    String k = s(batch.get(i));
                    PutStartResult r = reply.results().get(i);
                    boolean taken = complete.containsKey(k) || pending.containsKey(k);
                    assertThat(r.code()).as("put start, %s", at)
                            .isEqualTo(!upsert && taken ? ResultCode.ALREADY_EXISTS : ResultCode.OK);
                    if (r.code() != ResultCode.OK) {
                        continue;
                    }
                    assertThat(r.replicas()).as("replicas, %s", at).hasSize(replicas);
                    pending.put(k, new Obj(items.get(i).valueLength(), r.generation(), r.replicas()));
                    int fate = rnd.nextInt(10);
                    long failed = fate == 0 ? rnd.nextLong() & ((1L << replicas) - 1) : 0;
                    if (fate < 7) {
                        ends.add(new PutEndItem(batch.get(i), r.generation(), failed));
                    } else if (fate < 9) {
                        revokes.add(new PutEndItem(batch.get(i), r.generation(), 0));
                    }
                }
                List<ResultCode> ended = svc.putEnd(ends);
                for (int i = 0; i < ends.size(); i++) {
                    PutEndItem e = ends.get(i);
                    String k = s(e.key());
                    Obj p = pending.get(k);
                    ResultCode want;
                    if (p != null && p.generation == e.generation()) {
                        pending.remove(k);
                        List<Replica> kept = new ArrayList<>();
                        for (int r = 0; r < p.replicas.size(); r++) {
                            if ((e.failedReplicas() & (1L << r)) == 0) {
                                kept.add(p.replicas.get(r));
                            }
                        }
                        if (kept.isEmpty()) {
                            want = ResultCode.FAILED;
                        } else {
                            complete.put(k, new Obj(p.valueLength, p.generation, kept));
                            want = ResultCode.OK;
                        }
                    } else {
                        Obj c = complete.get(k);
                        want = c != null && c.generation == e.generation() ? ResultCode.OK : ResultCode.EXPIRED;
                    }
                    assertThat(ended.get(i)).as("put end of item %d, %s", i, at).isEqualTo(want);
                }
                List<ResultCode> revoked = svc.putRevoke(revokes);
                for (int i = 0; i < revokes.size(); i++) {
                    String k = s(revokes.get(i).key());
                    Obj p = pending.get(k);
                    boolean ok = p != null && p.generation == revokes.get(i).generation();
                    if (ok) {
                        pending.remove(k);
                    }
                    assertThat(revoked.get(i)).as("revoke, %s", at).isEqualTo(ok ? ResultCode.OK : ResultCode.EXPIRED);
                }
            } else if (op < 40) {
                // finish the puts left pending
                List<PutEndItem> ends = new ArrayList<>();
                pending.forEach((k, p) -> ends.add(new PutEndItem(k.getBytes(StandardCharsets.ISO_8859_1), p.generation, 0)));
                assertThat(svc.putEnd(ends)).as("late put ends, %s", at).allMatch(c -> c == ResultCode.OK);
                pending.forEach(complete::put);
                pending.clear();
            } else if (op < 50) {
                List<ResultCode> codes = svc.remove(batch);
                for (int i = 0; i < batch.size(); i++) {
                    boolean was = complete.remove(s(batch.get(i))) != null;
                    assertThat(codes.get(i)).as("remove, %s", at).isEqualTo(was ? ResultCode.OK : ResultCode.NOT_FOUND);
                }
            } else if (op < 53) {
                byte[] prefix = Arrays.copyOf(batch.getFirst(), Math.min(batch.getFirst().length, 1 + rnd.nextInt(4)));
                long want = complete.keySet().stream().filter(k -> k.startsWith(s(prefix))).count();
                assertThat(svc.removeByPrefix(prefix)).as("remove by prefix, %s", at).isEqualTo(want);
                complete.keySet().removeIf(k -> k.startsWith(s(prefix)));
            } else if (op < 54 && rnd.nextInt(4) == 0) {
                assertThat(svc.removeAll(false)).as("remove all, %s", at).isEqualTo(complete.size());
                complete.clear();
            } else if (op < 70) {
                boolean[] present = svc.probes().exists(batch);
                long[] sizes = svc.probes().sizes(batch);
                int prefix = 0;
                while (prefix < batch.size() && complete.containsKey(s(batch.get(prefix)))) {
                    prefix++;
                }
                assertThat(svc.probes().prefixMatch(batch)).as("prefix match, %s", at).isEqualTo(prefix);
                // by digest: with a narrow hash mask, many stored keys share the 32-bit hash, and only
                // the full 128-bit digest of the stored key may confirm a match
                DigestList d = DigestList.of(batch, 0, batch.size());
                assertThat(svc.probes().prefixMatchDigests(d.digests(), d.count())).as("prefix match by digest, %s", at)
                        .isEqualTo(prefix);
                boolean[] byDigest = svc.probes().existsDigests(d.digests(), d.count());
                for (int i = 0; i < batch.size(); i++) {
                    Obj c = complete.get(s(batch.get(i)));
                    assertThat(present[i]).as("exists, %s", at).isEqualTo(c != null);
                    assertThat(byDigest[i]).as("exists by digest, %s", at).isEqualTo(c != null);
                    assertThat(sizes[i]).as("size, %s", at).isEqualTo(c == null ? -1 : c.valueLength);
                }
            } else {
                List<ReplicaList> lists = svc.getReplicaList(batch);
                for (int i = 0; i < batch.size(); i++) {
                    Obj c = complete.get(s(batch.get(i)));
                    ReplicaList rl = lists.get(i);
                    if (c == null) {
                        assertThat(rl.code()).as("replica list of a missing key, %s", at).isEqualTo(ResultCode.NOT_FOUND);
                    } else {
                        assertThat(rl).as("replica list, %s", at)
                                .isEqualTo(new ReplicaList(ResultCode.OK, c.valueLength, c.generation, c.replicas));
                    }
                }
            }
            if (step % 25 == 0) {
                assertThat(svc.keyCount()).as("key count, %s", at).isEqualTo(complete.size());
                long bytes = 0;
                for (Map<String, Obj> m : List.of(complete, pending)) {
                    for (Map.Entry<String, Obj> e : m.entrySet()) {
                        bytes += ObjectLayout.regionLength(e.getKey().length(), e.getValue().valueLength)
                                * e.getValue().replicas.size();
                    }
                }
                assertThat(svc.allocated()).as("allocated bytes, %s", at).isEqualTo(bytes);
            }
        }
    }

    @Test
    void batchesVisitEveryKeyOnceShardByShardInBatchOrder() {
        for (int mask : new int[]{-1, 0xFC00_0000, 0x3, 0}) {
            ObjectIndex index = new ObjectIndex(mask);
            SplittableRandom rnd = new SplittableRandom(mask);
            List<byte[]> pool = keys(rnd, 500);
            for (int round = 0; round < 200; round++) {
                String at = "mask " + Integer.toHexString(mask) + ", round " + round;
                List<byte[]> batch = new ArrayList<>();
                int n = rnd.nextInt(300);
                for (int i = 0; i < n; i++) {
                    batch.add(pool.get(rnd.nextInt(pool.size())));
                }
                int[] visits = new int[n];
                List<ObjectIndex.Shard> shardsSeen = new ArrayList<>();
                int[] last = {-1};
                ObjectIndex.Shard[] current = {null};
                index.forEachKey(batch, (shard, i, key, hash) -> {
                    assertThat(shard.heldByCurrentThread()).as(at).isTrue();
                    assertThat(key).as(at).isSameAs(batch.get(i));
                    assertThat(hash).as(at).isEqualTo(Key.hash(key) & mask);
                    assertThat(shard).as(at).isSameAs(index.withShard(hash, x -> x));
                    if (shard != current[0]) {
                        assertThat(shardsSeen).as("each shard's lock once per batch, %s", at).doesNotContain(shard);
                        shardsSeen.add(shard);
                        current[0] = shard;
                        last[0] = -1;
                    }
                    assertThat(i).as("batch order within a shard, %s", at).isGreaterThan(last[0]);
                    last[0] = i;
                    visits[i]++;
                });
                for (int i = 0; i < n; i++) {
                    assertThat(visits[i]).as("visits of item %d, %s", i, at).isEqualTo(1);
                }
            }
        }
    }

    static String s(byte[] k) {
        return new String(k, StandardCharsets.ISO_8859_1);
    }

    /** Distinct keys of 1..512 bytes, a third of them under a few shared prefixes. */
    static List<byte[]> keys(SplittableRandom rnd, int n) {
        Set<String> seen = new HashSet<>();
        List<byte[]> out = new ArrayList<>();
        String[] prefixes = {"m1/", "m2/", "llama3-8b@v7/tp0/"};
        while (out.size() < n) {
            byte[] k;
            if (rnd.nextInt(3) == 0) {
                StringBuilder sb = new StringBuilder(prefixes[rnd.nextInt(prefixes.length)]);
                for (int i = 0, hex = 1 + rnd.nextInt(64); i < hex; i++) {
                    sb.append(Character.forDigit(rnd.nextInt(16), 16));
                }
                k = sb.toString().getBytes(StandardCharsets.ISO_8859_1);
            } else {
                k = new byte[1 + (rnd.nextInt(4) == 0 ? rnd.nextInt(512) : rnd.nextInt(40))];
                for (int i = 0; i < k.length; i++) {
                    k[i] = (byte) ('!' + rnd.nextInt(90));
                }
            }
            if (seen.add(s(k))) {
                out.add(k);
            }
        }
        return out;
    }
}
