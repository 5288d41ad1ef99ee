package tidelog.sql;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.dataformat.yaml.YAMLFactory;

import java.io.File;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.text.Normalizer;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
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
 * YAML: {@code name: [{roles: [...], scram: "SCRAM-SHA-256$<iter>:<salt>$<StoredKey>:<ServerKey>",
 * from: where}]} -- a list, because clusters imported into one warehouse may each have a user
 * of that name; a password matching any of them logs in with that entry's roles. It is read
 * again when its modification time or size changes, so `tidelog sql serve` on a running server
 * (a new cluster's users) needs no restart.
 *
 * <p>Failed logins are bounded per user name: each costs FAILURE_DELAY_MS on its connection's
 * thread, and FAILURES_MAX in a row lock the name for LOCKOUT_MS (the right password too is
 * refused then: guessing gets FAILURES_MAX tries a minute). Every refusal is logged.
 *
 * <p>Where the file is: the system property spark.tidelog.sql.users (spark-submit --conf puts
 * every spark.* setting there in the driver). Without it nobody logs in and nobody is an admin.
 */
public final class Users {
  static final String USERS_PROPERTY = "spark.tidelog.sql.users";
  static final String MECHANISM = "SCRAM-SHA-256";
  static final String ADMIN_ROLE = "admin";
  static final int ITERATIONS_MIN = 4096;            // broker/security/scram.py ITERATIONS
  static final int ITERATIONS_MAX = 1_000_000;       // a verifier cannot make a login cost minutes
  static final int FAILURES_MAX = 5;
  static final long LOCKOUT_MS = 60_000;
  static final long FAILURE_DELAY_MS = 1_000;
  static final int NAMES_TRACKED_MAX = 4096;         // failure counters kept (unknown names too)
  static final int PASSWORD_CHARS_MAX = 1024;
  static final Pattern NAME = Pattern.compile("[A-Za-z0-9_.-]{1,64}");  // no '@' or '/': HiveServer2 shortens those

  private static final Logger LOG = LoggerFactory.getLogger(Users.class);
  private static final Users INSTANCE = new Users();

  /** One verifier and the roles it grants. */
  static final class Entry {
    final byte[] salt;
    final byte[] storedKey;
    final int iterations;
    final List<String> roles;
    final String from;

    Entry(byte[] salt, byte[] storedKey, int iterations, List<String> roles, String from) {
      this.salt = salt;
      this.storedKey = storedKey;
      this.iterations = iterations;
      this.roles = roles;
      this.from = from;
    }
  }

  private static final class Failures {
    int count;
    long lockedUntilMs;
  }

  private volatile Map<String, List<Entry>> users = Collections.emptyMap();
  private long loadedMtime = -1;
  private long loadedSize = -1;
  private final Map<String, Failures> failures = new ConcurrentHashMap<>();

  static Users get() {
    return INSTANCE;
  }

  private synchronized Map<String, List<Entry>> current() {
    String path = System.getProperty(USERS_PROPERTY);
    if (path == null) {
      return Collections.emptyMap();
    }
    File f = new File(path);
    long mtime = f.lastModified();
    long size = f.length();
    if (mtime != loadedMtime || size != loadedSize) {
      try {
        users = parse(f);
        LOG.info("tidelog: {} user name(s) from {}", users.size(), f);
      } catch (Exception e) {  // a broken file: keep what was loaded, say why
        LOG.error("tidelog: cannot read the users file " + f + ": " + e);
        if (loadedMtime == -1) {
          users = Collections.emptyMap();
        }
      }
      loadedMtime = mtime;
      loadedSize = size;
    }
    return users;
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
            e.path("from").asText("")));
      }
      if (!entries.isEmpty()) {
        out.put(kv.getKey(), entries);
      }
    }
    return out;
  }

  /** The roles of the entry `password` proves, or null: unknown user, wrong password, locked. */
  List<String> login(String user, String password) {
    if (user == null || !NAME.matcher(user).matches()) {
      LOG.warn("tidelog: login refused: not a user name ({} characters)", user == null ? 0 : user.length());
      delay();
      return null;
    }
    String key = user;
    long now = System.currentTimeMillis();
    Failures f = failures.get(key);
    if (f != null) {
      synchronized (f) {
        if (f.lockedUntilMs > now) {
          LOG.warn("tidelog: login refused for user '{}': locked for {} s after {} failed logins",
              user, (f.lockedUntilMs - now + 999) / 1000, FAILURES_MAX);
          delay();
          return null;
        }
      }
    }
    List<Entry> entries = current().get(user);
    List<String> roles = null;
    String from = null;
    if (password != null && !password.isEmpty() && password.length() <= PASSWORD_CHARS_MAX) {
      if (entries == null) {
        storedKey(password, new byte[16], ITERATIONS_MIN);  // the same work as a known user's
      } else {
        for (Entry e : entries) {
          if (MessageDigest.isEqual(storedKey(password, e.salt, e.iterations), e.storedKey)) {
            roles = e.roles;
            from = e.from;
          }
        }
      }
    }
    if (roles != null) {
      failures.remove(key);
      LOG.info("tidelog: user '{}' logged in (roles {}, from {})", user, roles, from);
      return roles;
    }
    int count = recordFailure(key, now);
    LOG.warn("tidelog: login refused for user '{}': unknown user or wrong password ({} in a row{})",
        user, count, count >= FAILURES_MAX ? "; locked for " + LOCKOUT_MS / 1000 + " s" : "");
    delay();
    return null;
  }

  private int recordFailure(String key, long now) {
    if (failures.size() >= NAMES_TRACKED_MAX) {
      failures.values().removeIf(x -> x.lockedUntilMs <= now);
    }
    Failures f = failures.computeIfAbsent(key, k -> new Failures());
    synchronized (f) {
      f.count += 1;
      if (f.count >= FAILURES_MAX) {
        f.lockedUntilMs = now + LOCKOUT_MS;
        f.count = 0;
        return FAILURES_MAX;
      }
      return f.count;
    }
  }

  private static void delay() {
    try {
      Thread.sleep(FAILURE_DELAY_MS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  /** Is `user` an admin: does any of its entries hold the admin role? */
  boolean isAdmin(String user) {
    List<Entry> entries = user == null ? null : current().get(user);
    if (entries == null) {
      return false;
    }
    for (Entry e : entries) {
      if (e.roles.contains(ADMIN_ROLE)) {
        return true;
      }
    }
    return false;
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
