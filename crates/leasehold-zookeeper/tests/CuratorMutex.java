// A Curator InterProcessMutex on one lock path, driven over stdin/stdout
// by tests/curator.rs: `java CuratorMutex <connect string> <lock path>`.
// It starts acquiring at once (on its own thread: Curator's mutex belongs
// to the thread that took it) and says ACQUIRED when it holds the lock;
// `status` is answered HOLDING or WAITING; `release` releases the lock,
// says RELEASED and exits.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.ExponentialBackoffRetry;

public class CuratorMutex {
    public static void main(String[] args) throws Exception {
        CuratorFramework client = CuratorFrameworkFactory.newClient(
                args[0], 20000, 10000, new ExponentialBackoffRetry(100, 3));
        client.start();
        client.blockUntilConnected();
        InterProcessMutex mutex = new InterProcessMutex(client, args[1]);
        AtomicBoolean held = new AtomicBoolean();
        CountDownLatch release = new CountDownLatch(1);
        Thread taker = new Thread(() -> {
            try {
                mutex.acquire();
                held.set(true);
                say("ACQUIRED");
                release.await();
                held.set(false);
                mutex.release();
                say("RELEASED");
            } catch (Exception e) {
                say("ERROR " + e);
            }
        });
        taker.start();
        say("STARTED");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.trim().equals("status")) {
                say(held.get() ? "HOLDING" : "WAITING");
            } else if (line.trim().equals("release")) {
                release.countDown();
                taker.join();
                break;
            }
        }
        client.close();
        System.exit(0);
    }

    static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }
}
