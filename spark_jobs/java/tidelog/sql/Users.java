package tidelog.sql;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.dataformat.yaml.YAMLFactory;

import java.io.File;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.attribute.BasicFileAttributes;
import java.security.MessageDigest;
import java.text.Normalizer;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.TimeUnit;
import java.util.function.LongSupplier;
import java.util.function.Supplier;
import java.util.regex.Pattern;
import javax.crypto.Mac;
import javax.crypto.SecretKeyFactory;
import javax.crypto.spec.PBEKeySpec;
import javax.crypto.spec.SecretKeySpec;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The query server's users: who may log in (a SCRAM-SHA-256 verifier per password) and who is
 * an admin. Shared by the password check (ScramPasswordAuthenticator, at connect) and the SQL
 * guard (ReadOnlyGuard, at every statement), both in the server's JVM.
 *
 * <p>The file (spark_jobs/sqlsecurity.py writes it, 0600 in the 0700 security directory) is
 * YAML: {@code name: [{admin: bool, service: bool, roles: [...], scram:
 * "SCRAM-SHA-256$<iter>:<salt>$<StoredKey>:<ServerKey>", from: where}]} -- a list, because
 * clusters imported into one warehouse may each have a user of that name. {@code admin} is the
 * entry's own flag (its cluster's roles' admin flags, resolved in Python), never a role's name.
 * A password logs in as the entry it matches; but the guard knows a session by its user name
 * only, so a name is an admin only when every entry of it is one: the password of a plain user
 * of one cluster never buys the rights of an admin of that name in another (the mix is logged
 * when the file is read). The file is read again when its modification time, size or inode
 * changes (sqlsecurity.py replaces it by a rename), checked at every login and statement, so a
 * user deleted from it is refused from the next login on, and an open session of a name the
 * file no longer has is refused its next statement (ReadOnlyGuard).
 *
 * <p>Failed logins are bounded per user name of the file. An attempt is counted before its
 * password is checked, in the same step that checks the lock (one monitor), so parallel guesses
 * get FAILURES_MAX checks at most; a success takes its own count back. FAILURES_MAX failures
 * within FAILURE_WINDOW_MS lock the name for LOCKOUT_MS (the right password too is refused
 * then), and each failure costs FAILURE_DELAY_MS on its connection's thread. Names the file does
 * not have are never counted (no password matches them; they cost the same work and wait), so
 * the counters are the file's names only and made-up names cannot push a counting name out; at
 * NAMES_TRACKED_MAX, counters whose window and lock are over go first, and when none has, a name
 * without a counter is refused (fail closed). A service entry (the warehouse admin: a 256-bit
 * generated password, sqlserver.py says why) is never locked, so nobody can lock the platform
 * out of its own server. Every refusal is logged.
 *
 * <p>Where the file is: the system property spark.tidelog.sql.users (spark-submit --conf puts
 * every spark.* setting there in the driver). Without it nobody logs in and nobody is an admin.
 */
public final class Users {
  static final String USERS_PROPERTY = "spark.tidelog.sql.users";
  static final String MECHANISM = "SCRAM-SHA-256";
  static final int ITERATIONS_MIN = 4096;            // broker/security/scram.py ITERATIONS
  static final int ITERATIONS_MAX = 1_000_000;       // a verifier cannot make a login cost minutes
  static final int FAILURES_MAX = 5;
  static final long FAILURE_WINDOW_MS = 60_000;
  static final long LOCKOUT_MS = 60_000;
  static final long FAILURE_DELAY_MS = 1_000;
  static final int NAMES_TRACKED_MAX = 4096;         // failure counters kept (names of the file only)
  static final int PASSWORD_CHARS_MAX = 1024;
  static final Pattern NAME = Pattern.compile("[A-Za-z0-9_.-]{1,64}");  // no '@' or '/': HiveServer2 shortens those

  private static final Logger LOG = LoggerFactory.getLogger(Users.class);
  private static final Users INSTANCE = new Users(() -> System.getProperty(USERS_PROPERTY), FAILURE_DELAY_MS,
      NAMES_TRACKED_MAX, System::currentTimeMillis);

  /** One verifier and what it grants. */
  static final class Entry {
    final byte[] salt;
    final byte[] storedKey;
    final int iterations;
    final List<String> roles;
    final boolean admin;
    final boolean service;
    final String from;

    Entry(byte[] salt, byte[] storedKey, int iterations, List<String> roles, boolean admin, boolean service,
        String from) {
      this.salt = salt;
      this.storedKey = storedKey;
      this.iterations = iterations;
      this.roles = roles;
      this.admin = admin;
      this.service = service;
      this.from = from;
    }
  }

  /** What a login came to. */
  enum Outcome { OK, WRONG, LOCKED, UNKNOWN, BAD_NAME }

  private static final class Failures {
    int count;            // attempts counted in the window (in flight or failed)
    long windowStartMs;
    long lockedUntilMs;   // 0: not locked

    boolean over(long now) {
      return lockedUntilMs <= now && (count == 0 || now - windowStartMs >= FAILURE_WINDOW_MS);
    }
  }

  private final Supplier<String> path;
  private final long failureDelayMs;
  private final int namesTrackedMax;
  private final LongSupplier clockMs;

  private volatile Map<String, List<Entry>> users = Collections.emptyMap();
  private Object loadedVersion;
  private boolean loadedOnce;
  private final Map<String, Failures> failures = new HashMap<>();  // guarded by itself

  Users(Supplier<String> path, long failureDelayMs, int namesTrackedMax, LongSupplier clockMs) {
    this.path = path;
    this.failureDelayMs = failureDelayMs;
    this.namesTrackedMax = namesTrackedMax;
    this.clockMs = clockMs;
  }

  static Users get() {
    return INSTANCE;
  }

  synchronized Map<String, List<Entry>> current() {
    String p = path.get();
    if (p == null) {
      return Collections.emptyMap();
    }
    File f = new File(p);
    Object version = version(f);
    if (!Objects.equals(version, loadedVersion)) {
      try {
        users = parse(f);
        LOG.info("tidelog: {} user name(s) from {}", users.size(), f);
      } catch (Exception e) {  // a broken file: keep what was loaded, say why
        LOG.error("tidelog: cannot read the users file " + f + ": " + e);
        if (!loadedOnce) {
          users = Collections.emptyMap();
        }
      }
      loadedOnce = true;
      loadedVersion = version;
    }
    return users;
  }

  /** What tells one content of the file from the next: inode, size, modification time (ns). */
  private static Object version(File f) {
    try {
      BasicFileAttributes a = Files.readAttributes(f.toPath(), BasicFileAttributes.class);
      return List.of(String.valueOf(a.fileKey()), a.size(), a.lastModifiedTime().to(TimeUnit.NANOSECONDS));
    } catch (Exception e) {
      return "missing";
    }
  }

  static Map<String, List<Entry>> parse(File f) throws Exception {
    JsonNode root = new ObjectMapper(new YAMLFactory()).readTree(f);
    Map<String, List<Entry>> out = new HashMap<>();
    if (root == null || !root.isObject()) {
      return out;
    }
    for (Map.Entry<String, JsonNode> kv : root.properties()) {
      if (!NAME.matcher(kv.getKey()).matches()) {
        LOG.warn("tidelog: users file: skipping the name '{}' (it must match {})", kv.getKey(), NAME);
        continue;
      }
      List<Entry> entries = new ArrayList<>();
      for (JsonNode e : kv.getValue()) {
        String[] parts = e.path("scram").asText("").split("\\$");
        String[] itSalt = parts.length == 3 ? parts[1].split(":") : new String[0];
        String[] keys = parts.length == 3 ? parts[2].split(":") : new String[0];
        if (parts.length != 3 || !MECHANISM.equals(parts[0]) || itSalt.length != 2 || keys.length != 2) {
          LOG.warn("tidelog: users file: user '{}' has no {} verifier; skipped", kv.getKey(), MECHANISM);
          continue;
        }
        int iterations = Integer.parseInt(itSalt[0]);
        byte[] stored = Base64.getDecoder().decode(keys[0]);
        if (iterations < ITERATIONS_MIN || iterations > ITERATIONS_MAX || stored.length != 32) {
          LOG.warn("tidelog: users file: user '{}' has a verifier out of bounds; skipped", kv.getKey());
          continue;
        }
        List<String> roles = new ArrayList<>();
        for (JsonNode r : e.path("roles")) {
          roles.add(r.asText());
        }
        entries.add(new Entry(Base64.getDecoder().decode(itSalt[1]), stored, iterations, roles,
            e.path("admin").asBoolean(false), e.path("service").asBoolean(false), e.path("from").asText("")));
      }
      if (entries.isEmpty()) {
        continue;
      }
      if (entries.stream().anyMatch(x -> x.admin) && !entries.stream().allMatch(x -> x.admin)) {
        LOG.warn("tidelog: users file: user '{}' is an admin in some clusters, not in others: no SQL admin",
            kv.getKey());
      }
      out.put(kv.getKey(), entries);
    }
    return out;
  }

  /** The entry `password` proves, or null: unknown user, wrong password, locked. */
  Entry login(String user, String password) {
    Entry[] matched = new Entry[1];
    return attempt(user, password, matched) == Outcome.OK ? matched[0] : null;
  }

  /** One login attempt: its outcome; `matched[0]` the entry the password proved. */
  Outcome attempt(String user, String password, Entry[] matched) {
    if (user == null || !NAME.matcher(user).matches()) {
      LOG.warn("tidelog: login refused: not a user name ({} characters)", user == null ? 0 : user.length());
      delay();
      return Outcome.BAD_NAME;
    }
    List<Entry> entries = current().get(user);
    boolean usable = password != null && !password.isEmpty() && password.length() <= PASSWORD_CHARS_MAX;
    boolean counted = entries != null && !entries.stream().allMatch(e -> e.service);
    long now = clockMs.getAsLong();
    int count = counted ? admit(user, now) : 0;
    if (counted && count == 0) {
      storedKey(usable ? password : "-", new byte[16], ITERATIONS_MIN);  // the same work as a check
      LOG.warn("tidelog: login refused for user '{}': locked after {} failed logins in {} s", user,
          FAILURES_MAX, FAILURE_WINDOW_MS / 1000);
      delay();
      return Outcome.LOCKED;
    }
    if (usable && entries == null) {
      storedKey(password, new byte[16], ITERATIONS_MIN);  // the same work as a known user's
    } else if (usable) {
      for (Entry e : entries) {
        if (MessageDigest.isEqual(storedKey(password, e.salt, e.iterations), e.storedKey)) {
          matched[0] = e;
          break;
        }
      }
    }
    if (matched[0] != null) {
      if (counted) {
        succeeded(user, now);
      }
      LOG.info("tidelog: user '{}' logged in (roles {}, from {})", user, matched[0].roles, matched[0].from);
      return Outcome.OK;
    }
    LOG.warn("tidelog: login refused for user '{}': unknown user or wrong password{}", user,
        !counted ? "" : " (" + count + " in " + FAILURE_WINDOW_MS / 1000 + " s"
            + (count >= FAILURES_MAX ? "; locked for " + LOCKOUT_MS / 1000 + " s)" : ")"));
    delay();
    return entries == null ? Outcome.UNKNOWN : Outcome.WRONG;
  }

  /**
   * Counts an attempt of `user` before its password is checked: its number in the window, or 0
   * when the name is locked or no counter can be kept for it. The attempt that reaches
   * FAILURES_MAX locks the name at once, so no later one is checked while it is in flight.
   */
  private int admit(String user, long now) {
    synchronized (failures) {
      Failures f = failures.get(user);
      if (f == null) {
        if (failures.size() >= namesTrackedMax) {
          failures.values().removeIf(x -> x.over(now));
        }
        if (failures.size() >= namesTrackedMax) {
          LOG.error("tidelog: {} names are counting failed logins: user '{}' is refused until one's window "
              + "is over", failures.size(), user);
          return 0;
        }
        f = new Failures();
        failures.put(user, f);
      }
      if (f.lockedUntilMs > now) {
        return 0;
      }
      if (f.lockedUntilMs != 0 || now - f.windowStartMs >= FAILURE_WINDOW_MS) {
        f.lockedUntilMs = 0;
        f.count = 0;
      }
      if (f.count == 0) {
        f.windowStartMs = now;
      }
      f.count += 1;
      if (f.count >= FAILURES_MAX) {
        f.lockedUntilMs = now + LOCKOUT_MS;
      }
      return f.count;
    }
  }

  /** The attempt admit() counted proved its password: it was no failure. */
  private void succeeded(String user, long now) {
    synchronized (failures) {
      Failures f = failures.get(user);
      if (f == null) {
        return;
      }
      f.count = Math.max(0, f.count - 1);
      if (f.count < FAILURES_MAX) {
        f.lockedUntilMs = 0;  // the lock this very attempt set, counting itself as a failure
      }
      if (f.count == 0) {
        failures.remove(user);
      }
    }
  }

  private void delay() {
    if (failureDelayMs <= 0) {
      return;
    }
    try {
      Thread.sleep(failureDelayMs);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  /** Is `user` a SQL admin: is every entry of that name an admin? */
  boolean isAdmin(String user) {
    List<Entry> entries = user == null ? null : current().get(user);
    return entries != null && entries.stream().allMatch(e -> e.admin);
  }

  /** Does the users file (as it is now) have `user`? */
  boolean has(String user) {
    return user != null && current().containsKey(user);
  }

  /** RFC 5802: StoredKey = H(HMAC(SaltedPassword, "Client Key")), SaltedPassword = Hi(password, salt, i). */
  static byte[] storedKey(String password, byte[] salt, int iterations) {
    try {
      // SASLprep, as scramp applies it, is NFKC plus mapping and prohibitions; for the
      // passwords Tidelog makes (URL-safe ASCII) both are the identity
      char[] pw = Normalizer.normalize(password, Normalizer.Form.NFKC).toCharArray();
      SecretKeyFactory pbkdf2 = SecretKeyFactory.getInstance("PBKDF2WithHmacSHA256");
      byte[] salted = pbkdf2.generateSecret(new PBEKeySpec(pw, salt, iterations, 256)).getEncoded();
      Mac mac = Mac.getInstance("HmacSHA256");
      mac.init(new SecretKeySpec(salted, "HmacSHA256"));
      byte[] clientKey = mac.doFinal("Client Key".getBytes(StandardCharsets.US_ASCII));
      return MessageDigest.getInstance("SHA-256").digest(clientKey);
    } catch (Exception e) {
      throw new IllegalStateException("PBKDF2WithHmacSHA256 / HmacSHA256 unavailable: " + e, e);
    }
  }
}
