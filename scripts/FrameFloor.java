import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.InetSocketAddress;
import java.net.StandardSocketOptions;
import java.nio.ByteBuffer;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Queue;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The floor under a server's CPU per small request on this machine, with nothing of kvpool in it: a
 * server that answers each 128-byte request with a 56-byte reply, against 1,000 connections that each
 * keep one request in flight (as 1,000 nodes heartbeating back to back do). It serves them three ways,
 * one after another, and prints the server process's CPU per request (from /proc, user and system):
 *
 *   threads   a platform thread per connection, blocking reads (the way kvpool's servers work)
 *   vthreads  a virtual thread per connection
 *   loop      one selector thread for every connection (the way the master serves heartbeats, FrameLoop)
 *
 * Run from the repository root: java scripts/FrameFloor.java [connections] [seconds]   (JDK 25; about 40 s)
 * Used for docs/benchmarks.md, "Scale": why a heartbeat cost 16 us on a thread per connection.
 */
public class FrameFloor {
    static final int REQUEST = 128;
    static final int REPLY = 56;
    public static void main(String[] args) throws Exception {
        int conns = args.length > 0 ? Integer.parseInt(args[0]) : 1000;
        int seconds = args.length > 1 ? Integer.parseInt(args[1]) : 10;
        if (args.length > 2) { // a child: serve one way until killed
            serve(args[2]);
            return;
        }
        String java = ProcessHandle.current().info().command().orElse("java");
        Path source = Path.of("scripts", "FrameFloor.java"); // run from the repository root
        for (String mode : List.of("threads", "vthreads", "loop")) {
            Process server = new ProcessBuilder(java, source.toString(), "0", "0", mode)
                    .redirectError(ProcessBuilder.Redirect.INHERIT).start();
            int port = Integer.parseInt(new String(server.getInputStream().readNBytes(6)).trim());
            List<SocketChannel> open = clients(port, conns);
            long pid = server.pid();
            Thread.sleep(1000); // warm up
            long c0 = cpuMicros(pid);
            long n0 = requests.get();
            long t0 = System.nanoTime();
            drive(open, seconds);
            long c1 = cpuMicros(pid);
            long n1 = requests.get();
            double wall = (System.nanoTime() - t0) / 1e9;
            System.out.printf("%-9s %8.0f requests/s  %6.2f us of server CPU a request  (server %.2f cores)%n", mode,
                    (n1 - n0) / wall, (double) (c1 - c0) / (n1 - n0), (c1 - c0) / 1e6 / wall);
            server.destroy();
            server.waitFor();
            for (SocketChannel c : open) {
                c.close();
            }
        }
        System.exit(0);
    }

    static final AtomicLong requests = new AtomicLong();
    static Selector clientSelector;
    static final ByteBuffer request = ByteBuffer.allocateDirect(REQUEST);

    static List<SocketChannel> clients(int port, int n) throws IOException {
        clientSelector = Selector.open();
        List<SocketChannel> out = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            SocketChannel c = SocketChannel.open(new InetSocketAddress("127.0.0.1", port));
            c.setOption(StandardSocketOptions.TCP_NODELAY, true);
            c.configureBlocking(false);
            c.register(clientSelector, SelectionKey.OP_READ, ByteBuffer.allocateDirect(REPLY));
            request.clear();
            c.write(request);
            out.add(c);
        }
        return out;
    }

    /** Keeps one request in flight on every connection for {@code seconds} (from the warm-up on). */
    static void drive(List<SocketChannel> open, int seconds) throws IOException {
        long end = System.nanoTime() + seconds * 1_000_000_000L;
        while (System.nanoTime() < end) {
            clientSelector.select(100);
            Iterator<SelectionKey> it = clientSelector.selectedKeys().iterator();
            while (it.hasNext()) {
                SelectionKey k = it.next();
                it.remove();
                SocketChannel c = (SocketChannel) k.channel();
                ByteBuffer b = (ByteBuffer) k.attachment();
                if (c.read(b) < 0) {
                    k.cancel();
                    continue;
                }
                if (!b.hasRemaining()) {
                    b.clear();
                    request.clear();
                    c.write(request);
                    requests.incrementAndGet();
                }
            }
        }
    }

    /** A process's CPU time (user and system), in microseconds, from /proc (10 ms ticks: use long runs). */
    static long cpuMicros(long pid) throws IOException {
        String s = Files.readString(Path.of("/proc/" + pid + "/stat"));
        String[] f = s.substring(s.lastIndexOf(')') + 2).split(" ");
        return (Long.parseLong(f[11]) + Long.parseLong(f[12])) * 10_000L;
    }

    static void serve(String mode) throws Exception {
        ServerSocketChannel ss = ServerSocketChannel.open().bind(new InetSocketAddress("127.0.0.1", 0), 4096);
        System.out.printf("%6d", ((InetSocketAddress) ss.getLocalAddress()).getPort());
        System.out.flush();
        Selector sel = mode.equals("loop") ? Selector.open() : null;
        Queue<SocketChannel> joining = new ConcurrentLinkedQueue<>();
        if (sel != null) {
            Thread.ofPlatform().start(() -> loop(sel, joining));
        }
        while (true) {
            SocketChannel c = ss.accept();
            c.setOption(StandardSocketOptions.TCP_NODELAY, true);
            if (sel != null) {
                c.configureBlocking(false);
                joining.add(c);
                sel.wakeup();
            } else {
                Runnable r = () -> echo(c);
                if (mode.equals("vthreads")) {
                    Thread.ofVirtual().start(r);
                } else {
                    Thread.ofPlatform().stackSize(256 << 10).start(r);
                }
            }
        }
    }

    static void echo(SocketChannel c) {
        ByteBuffer in = ByteBuffer.allocateDirect(REQUEST);
        ByteBuffer out = ByteBuffer.allocateDirect(REPLY);
        try {
            while (true) {
                in.clear();
                while (in.hasRemaining()) {
                    if (c.read(in) < 0) {
                        return;
                    }
                }
                out.clear();
                c.write(out);
            }
        } catch (IOException e) {
            // the driver went away
        }
    }

    static void loop(Selector sel, Queue<SocketChannel> joining) {
        ByteBuffer out = ByteBuffer.allocateDirect(REPLY);
        try {
            while (true) {
                sel.select();
                SocketChannel j;
                while ((j = joining.poll()) != null) {
                    j.register(sel, SelectionKey.OP_READ, ByteBuffer.allocateDirect(REQUEST));
                }
                Iterator<SelectionKey> it = sel.selectedKeys().iterator();
                while (it.hasNext()) {
                    SelectionKey k = it.next();
                    it.remove();
                    SocketChannel c = (SocketChannel) k.channel();
                    ByteBuffer in = (ByteBuffer) k.attachment();
                    try {
                        if (c.read(in) < 0) {
                            k.cancel();
                            c.close();
                            continue;
                        }
                    } catch (IOException e) {
                        k.cancel();
                        c.close();
                        continue;
                    }
                    if (!in.hasRemaining()) {
                        in.clear();
                        out.clear();
                        c.write(out);
                    }
                }
            }
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }
}
