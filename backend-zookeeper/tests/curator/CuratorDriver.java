// Drives Apache Curator's InterProcessReadWriteLock, InterProcessSemaphoreV2 and
// LeaderLatch over stdin/stdout for backend-zookeeper/tests/curator.rs. Each command
// takes a new recipe instance (so no Curator re-entrancy) and answers one line:
//   read PATH WAIT_MS | write PATH WAIT_MS | sem PATH MAX WAIT_MS  ->  held | busy
//   release                                                        ->  released
//   churn PATH MAX ROUNDS INSIDE  -> done: two threads each take a lease ROUNDS times,
//     marking their time inside with an ephemeral node in INSIDE
//   latch PATH [ID]  -> started: starts a LeaderLatch (id "" without ID), the current one
//   await WAIT_MS    -> leader | follower: the current latch's await
//   leads            -> leader | follower: the current latch's hasLeadership()
//   leader           -> id=ID | none: the current latch's getLeader()
//   close            -> closed: closes the current latch (resigning if it leads)
//   latchchurn PATH ROUNDS INSIDE -> done: two threads each lead ROUNDS times through a
//     new LeaderLatch, marking their time as leader with an ephemeral node in INSIDE
// (release returns the most recent grant still held). Errors answer "error ...".
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.ArrayDeque;
import java.util.Deque;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.Participant;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryOneTime;
import org.apache.zookeeper.CreateMode;

public class CuratorDriver {
    public static void main(String[] args) throws Exception {
        CuratorFramework client =
                CuratorFrameworkFactory.newClient(args[0], 10000, 10000, new RetryOneTime(100));
        client.start();
        client.blockUntilConnected();
        Deque<AutoCloseable> held = new ArrayDeque<>();
        LeaderLatch latch = null;
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        say("ready");
        String line;
        while ((line = in.readLine()) != null) {
            String[] words = line.trim().split(" ");
            try {
                switch (words[0]) {
                    case "read":
                    case "write": {
                        InterProcessReadWriteLock rw = new InterProcessReadWriteLock(client, words[1]);
                        InterProcessMutex mutex = words[0].equals("read") ? rw.readLock() : rw.writeLock();
                        if (mutex.acquire(Long.parseLong(words[2]), TimeUnit.MILLISECONDS)) {
                            held.push(mutex::release);
                            say("held");
                        } else {
                            say("busy");
                        }
                        break;
                    }
                    case "sem": {
                        InterProcessSemaphoreV2 semaphore =
                                new InterProcessSemaphoreV2(client, words[1], Integer.parseInt(words[2]));
                        Lease lease = semaphore.acquire(Long.parseLong(words[3]), TimeUnit.MILLISECONDS);
                        if (lease != null) {
                            held.push(lease::close);
                            say("held");
                        } else {
                            say("busy");
                        }
                        break;
                    }
                    case "churn": {
                        String path = words[1];
                        int max = Integer.parseInt(words[2]);
                        int rounds = Integer.parseInt(words[3]);
                        String inside = words[4];
                        Exception[] failure = new Exception[1];
                        Thread[] threads = new Thread[2];
                        for (int t = 0; t < threads.length; t++) {
                            threads[t] = new Thread(() -> {
                                try {
                                    InterProcessSemaphoreV2 semaphore = new InterProcessSemaphoreV2(client, path, max);
                                    for (int round = 0; round < rounds; round++) {
                                        Lease lease = semaphore.acquire(30, TimeUnit.SECONDS);
                                        if (lease == null) {
                                            throw new IllegalStateException("no lease within 30 s");
                                        }
                                        String mark = client.create()
                                                .withMode(CreateMode.EPHEMERAL_SEQUENTIAL)
                                                .forPath(inside + "/curator-");
                                        Thread.sleep(5);
                                        client.delete().forPath(mark);
                                        lease.close();
                                    }
                                } catch (Exception e) {
                                    synchronized (failure) {
                                        failure[0] = e;
                                    }
                                }
                            });
                            threads[t].start();
                        }
                        for (Thread thread : threads) {
                            thread.join();
                        }
                        say(failure[0] == null ? "done" : "error " + failure[0]);
                        break;
                    }
                    case "latchchurn": {
                        String path = words[1];
                        int rounds = Integer.parseInt(words[2]);
                        String inside = words[3];
                        Exception[] failure = new Exception[1];
                        Thread[] threads = new Thread[2];
                        for (int t = 0; t < threads.length; t++) {
                            String id = "java-" + t;
                            threads[t] = new Thread(() -> {
                                try {
                                    for (int round = 0; round < rounds; round++) {
                                        try (LeaderLatch churning = new LeaderLatch(client, path, id)) {
                                            churning.start();
                                            if (!churning.await(30, TimeUnit.SECONDS)) {
                                                throw new IllegalStateException("no leadership within 30 s");
                                            }
                                            String mark = client.create()
                                                    .withMode(CreateMode.EPHEMERAL_SEQUENTIAL)
                                                    .forPath(inside + "/curator-");
                                            Thread.sleep(5);
                                            client.delete().forPath(mark);
                                        }
                                    }
                                } catch (Exception e) {
                                    synchronized (failure) {
                                        failure[0] = e;
                                    }
                                }
                            });
                            threads[t].start();
                        }
                        for (Thread thread : threads) {
                            thread.join();
                        }
                        say(failure[0] == null ? "done" : "error " + failure[0]);
                        break;
                    }
                    case "latch": {
                        latch = new LeaderLatch(client, words[1], words.length > 2 ? words[2] : "");
                        latch.start();
                        say("started");
                        break;
                    }
                    case "await":
                        say(latch.await(Long.parseLong(words[1]), TimeUnit.MILLISECONDS) ? "leader" : "follower");
                        break;
                    case "leads":
                        say(latch.hasLeadership() ? "leader" : "follower");
                        break;
                    case "leader": {
                        Participant leader = latch.getLeader();
                        say(leader.isLeader() ? "id=" + leader.getId() : "none");
                        break;
                    }
                    case "close":
                        latch.close();
                        latch = null;
                        say("closed");
                        break;
                    case "release":
                        held.pop().close();
                        say("released");
                        break;
                    default:
                        say("error unknown command " + words[0]);
                }
            } catch (Exception e) {
                say("error " + e);
            }
        }
        client.close();
    }

    private static void say(String answer) {
        System.out.println(answer);
        System.out.flush();
    }
}
