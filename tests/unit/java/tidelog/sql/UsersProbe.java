package tidelog.sql;

import java.io.File;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Drives tidelog.sql.Users without a server, for tests/unit/test_sql_users.py: each scenario
 * prints one line per step, "<step> <outcome>", for the test to compare. No failure delay; the
 * clock is the probe's own (CLOCK), moved by the scenarios.
 *
 *   parallel FILE USER PASSWORD THREADS   THREADS wrong guesses at once, then the right password
 *   cycle FILE                            counters kept through made-up and other names (capacity 4)
 *   admin FILE                            isAdmin of each name the file has, after a login
 *   service FILE USER PASSWORD            20 wrong guesses at the service name, then the right one
 *   reload FILE NEXT USER PASSWORD        the file replaced by NEXT (a rename) between two logins
 */
public final class UsersProbe {
  static final AtomicLong CLOCK = new AtomicLong(1_000_000);

  static Users users(String file, int namesTrackedMax) {
    return new Users(() -> file, 0, namesTrackedMax, CLOCK::get);
  }

  static String attempt(Users u, String user, String password) {
    return u.attempt(user, password, new Users.Entry[1]).name();
  }

  public static void main(String[] a) throws Exception {
    switch (a[0]) {
      case "parallel": {
        Users u = users(a[1], Users.NAMES_TRACKED_MAX);
        int threads = Integer.parseInt(a[4]);
        CountDownLatch go = new CountDownLatch(1);
        List<String> outcomes = java.util.Collections.synchronizedList(new ArrayList<>());
        List<Thread> all = new ArrayList<>();
        for (int i = 0; i < threads; i++) {
          String guess = "guess-" + i;
          Thread t = new Thread(() -> {
            try {
              go.await();
            } catch (InterruptedException e) {
              return;
            }
            outcomes.add(attempt(u, a[2], guess));
          });
          t.start();
          all.add(t);
        }
        go.countDown();
        for (Thread t : all) {
          t.join();
        }
        System.out.println("WRONG " + outcomes.stream().filter("WRONG"::equals).count());
        System.out.println("LOCKED " + outcomes.stream().filter("LOCKED"::equals).count());
        System.out.println("right " + attempt(u, a[2], a[3]));
        break;
      }
      case "cycle": {  // names in the file: target (password "target-pw"), k1..k4 ("k-pw")
        Users u = users(a[1], 4);
        for (int i = 1; i <= 4; i++) {
          System.out.println("target-" + i + " " + attempt(u, "target", "wrong"));
        }
        for (int i = 0; i < 200; i++) {  // made-up names: never counted
          attempt(u, "made-up-" + i, "wrong");
        }
        for (int i = 1; i <= 3; i++) {    // three more of the file's names: the counters are full
          System.out.println("k" + i + " " + attempt(u, "k" + i, "wrong"));
        }
        System.out.println("k4 " + attempt(u, "k4", "k-pw"));        // no counter free: refused
        System.out.println("target-5 " + attempt(u, "target", "wrong"));
        System.out.println("target-right " + attempt(u, "target", "target-pw"));
        CLOCK.addAndGet(Users.FAILURE_WINDOW_MS + Users.LOCKOUT_MS);
        System.out.println("later-k4 " + attempt(u, "k4", "k-pw"));
        System.out.println("later-target " + attempt(u, "target", "target-pw"));
        break;
      }
      case "admin": {
        Users u = users(a[1], Users.NAMES_TRACKED_MAX);
        for (String name : new java.util.TreeSet<>(u.current().keySet())) {
          System.out.println(name + " " + u.isAdmin(name));
        }
        System.out.println("nobody " + u.isAdmin("nobody"));
        break;
      }
      case "service": {
        Users u = users(a[1], Users.NAMES_TRACKED_MAX);
        List<String> outcomes = new ArrayList<>();
        for (int i = 0; i < 20; i++) {
          outcomes.add(attempt(u, a[2], "guess-" + i));
        }
        System.out.println("guesses " + String.join(",", new java.util.TreeSet<>(outcomes)));
        System.out.println("right " + attempt(u, a[2], a[3]));
        break;
      }
      case "reload": {
        Users u = users(a[1], Users.NAMES_TRACKED_MAX);
        System.out.println("before " + attempt(u, a[3], a[4]) + " " + u.has(a[3]));
        Files.move(new File(a[2]).toPath(), new File(a[1]).toPath(), StandardCopyOption.REPLACE_EXISTING,
            StandardCopyOption.ATOMIC_MOVE);
        System.out.println("after " + attempt(u, a[3], a[4]) + " " + u.has(a[3]));
        break;
      }
      default:
        throw new IllegalArgumentException("unknown scenario " + a[0]);
    }
  }
}
