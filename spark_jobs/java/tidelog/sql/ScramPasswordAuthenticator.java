package tidelog.sql;

import javax.security.sasl.AuthenticationException;

import org.apache.hive.service.auth.PasswdAuthenticationProvider;

/**
 * HiveServer2's password check (hive.server2.authentication=CUSTOM): the user name and password
 * a client sends in SASL PLAIN -- inside TLS, the server's only listener -- against the users'
 * SCRAM-SHA-256 verifiers (Users). HiveServer2 makes one of these per login.
 */
public final class ScramPasswordAuthenticator implements PasswdAuthenticationProvider {
  @Override
  public void Authenticate(String user, String password) throws AuthenticationException {
    if (Users.get().login(user, password) == null) {
      throw new AuthenticationException("unknown user or wrong password");
    }
  }
}
