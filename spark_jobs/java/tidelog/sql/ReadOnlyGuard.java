package tidelog.sql;

import java.io.File;
import java.io.IOException;
import java.net.URI;
import java.util.Arrays;
import java.util.HashSet;
import java.util.Set;

import org.apache.hadoop.fs.Path;
import org.apache.hadoop.security.UserGroupInformation;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.catalog.CatalogTable;
import org.apache.spark.sql.catalyst.catalog.HiveTableRelation;
import org.apache.spark.sql.catalyst.expressions.CallMethodViaReflection;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.SubqueryExpression;
import org.apache.spark.sql.catalyst.plans.QueryPlan;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.execution.datasources.HadoopFsRelation;
import org.apache.spark.sql.execution.datasources.LogicalRelation;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.Function1;
import scala.collection.Iterator;
import scala.runtime.AbstractFunction1;
import scala.runtime.BoxedUnit;

/**
 * The query server's SQL guard (spark.sql.extensions: a static setting, which no client can
 * change): an analysis check rule that lets a session whose user is not an admin (Users) run
 * only reads of the warehouse's catalog tables and a few read-only commands. Check rules run
 * when a statement is analysed, before a command runs (ADD JAR, CREATE TABLE ... are
 * commands Spark executes eagerly, right after analysis), so a refused statement does nothing.
 *
 * <p>Whitelists, not blacklists: a plan node whose class is not named here is refused, with
 * its name in the message (a read-only statement refused so is one to add). Leaves must be
 * catalog tables whose files are the warehouse's tables (never a path: text.`/etc`, never
 * _catalog/), or rows the query itself makes (VALUES, range). Expressions are Spark's own,
 * but for reflect/java_method/try_reflect (CallMethodViaReflection: any static method); the
 * subqueries inside expressions are checked as plans.
 *
 * <p>Whose session: HiveServer2 runs each session's operations as its user
 * (hive.server2.enable.doAs=true: a UserGroupInformation of the authenticated name, also on
 * the background pool's threads), so the rule reads UserGroupInformation.getCurrentUser().
 * Any other caller (the server's own statements) is the process's user, not an admin unless
 * the users file says so. A session's user the users file no longer has (deleted since it
 * logged in) is refused every statement.
 */
public final class ReadOnlyGuard extends AbstractFunction1<SparkSessionExtensions, BoxedUnit> {
  static final String WAREHOUSE_PROPERTY = "spark.tidelog.sql.warehouse";
  static final String CODE = "[TIDELOG_SQL_NOT_ALLOWED] ";
  private static final Logger LOG = LoggerFactory.getLogger(ReadOnlyGuard.class);

  /** Relational operators a query of tables is made of (catalyst.plans.logical). */
  static final Set<String> OPERATORS = new HashSet<>(Arrays.asList(
      "Project", "Filter", "Aggregate", "Sort", "GlobalLimit", "LocalLimit", "Offset", "Tail",
      "Join", "LateralJoin", "Union", "Intersect", "Except", "Distinct", "Deduplicate",
      "DeduplicateWithinWatermark", "Window", "WindowGroupLimit", "Generate", "Expand", "Sample",
      "SubqueryAlias", "View", "WithCTE", "CTERelationDef", "Subquery", "ResolvedHint",
      "Repartition", "RepartitionByExpression", "RebalancePartitions", "Pivot", "Unpivot",
      "Transpose", "TableSample",
      // the server's own wrapper of every statement's plan: it turns the rows into Row objects
      "DeserializeToObject"));

  /** Leaves that hold no data from outside the statement (or name a catalog object). */
  static final Set<String> SAFE_LEAVES = new HashSet<>(Arrays.asList(
      "LocalRelation", "OneRowRelation", "Range", "CTERelationRef", "ResolvedNamespace",
      "ResolvedTable", "ResolvedPersistentView", "ResolvedTempView", "ResolvedIdentifier",
      "ResolvedV1TableIdentifier", "ResolvedV1Identifier", "ResolvedNonPersistentFunc",
      "ResolvedPersistentFunc", "EmptyRelation"));

  /** Commands that only show the catalog, or pick the current database. */
  static final Set<String> READ_ONLY_COMMANDS = new HashSet<>(Arrays.asList(
      "ShowTables", "ShowTablesCommand", "ShowTableExtended", "ShowNamespaces",
      "ShowNamespacesCommand", "ShowColumns", "ShowColumnsCommand", "ShowPartitions",
      "ShowPartitionsCommand", "ShowFunctions", "ShowFunctionsCommand", "ShowViews",
      "ShowViewsCommand", "ShowCreateTable", "ShowCreateTableCommand", "ShowTableProperties",
      "ShowTablePropertiesCommand", "ShowCatalogs", "ShowCurrentNamespace",
      "ShowCurrentNamespaceCommand", "DescribeRelation", "DescribeTableCommand",
      "DescribeColumn", "DescribeColumnCommand", "DescribeNamespace", "DescribeDatabaseCommand",
      "DescribeFunction", "DescribeFunctionCommand", "SetCatalogAndNamespace",
      "SetNamespaceCommand"));

  @Override
  public BoxedUnit apply(SparkSessionExtensions extensions) {
    extensions.injectCheckRule(new AbstractFunction1<SparkSession, Function1<LogicalPlan, BoxedUnit>>() {
      @Override
      public Function1<LogicalPlan, BoxedUnit> apply(SparkSession session) {
        return new AbstractFunction1<LogicalPlan, BoxedUnit>() {
          @Override
          public BoxedUnit apply(LogicalPlan plan) {
            check(plan);
            return BoxedUnit.UNIT;
          }
        };
      }
    });
    return BoxedUnit.UNIT;
  }

  /** The server process's own user: the statements the server runs for itself are its. */
  static String serverUser() {
    try {
      return UserGroupInformation.getLoginUser().getShortUserName();
    } catch (IOException e) {
      return null;
    }
  }

  static String currentUser() {
    try {
      return UserGroupInformation.getCurrentUser().getShortUserName();
    } catch (IOException e) {
      return null;
    }
  }

  static void check(LogicalPlan plan) {
    String user = currentUser();
    if (user != null && !Users.get().has(user) && !user.equals(serverUser())) {
      // a session whose user was deleted since it logged in (tidelog user delete, a new import)
      LOG.warn("tidelog: refused for user '{}': no longer in the users file", user);
      throw new SecurityException(CODE + "user '" + user + "' may no longer log in to this server (it is not "
          + "among its users any more)");
    }
    if (Users.get().isAdmin(user)) {
      return;
    }
    String why = refusal(plan, warehouse());
    if (why != null) {
      LOG.warn("tidelog: refused for user '{}': {}", user, why);
      throw new SecurityException(CODE + "user '" + user + "' is not an admin: " + why + " is refused (a user "
          + "who is not an admin may read the warehouse's tables: SELECT, SHOW, DESCRIBE, USE)");
    }
  }

  /** The warehouse's root, resolved (null: not configured, then no table is readable). */
  static File warehouse() {
    String w = System.getProperty(WAREHOUSE_PROPERTY);
    if (w == null) {
      return null;
    }
    try {
      return new File(w).getCanonicalFile();
    } catch (IOException e) {
      return null;
    }
  }

  /** What in `plan` is not allowed to a non-admin, or null. */
  static String refusal(LogicalPlan plan, File warehouse) {
    String name = plan.getClass().getSimpleName();
    if (plan.getClass().getName().endsWith("ScriptTransformation")) {
      return "TRANSFORM ... USING (runs a program on the server)";
    }
    if (plan instanceof LogicalRelation) {
      return relation((LogicalRelation) plan, warehouse);
    }
    if (plan instanceof HiveTableRelation) {
      CatalogTable t = ((HiveTableRelation) plan).tableMeta();
      return inWarehouse(t.location(), warehouse) ? null : "table " + t.identifier() + " (outside the warehouse)";
    }
    boolean command = plan instanceof org.apache.spark.sql.catalyst.plans.logical.Command;
    if (command && !READ_ONLY_COMMANDS.contains(name)) {
      return "the command " + name;
    }
    if (!command && plan.children().isEmpty() && !SAFE_LEAVES.contains(name)) {
      return "reading from " + name;
    }
    if (!command && !plan.children().isEmpty() && !OPERATORS.contains(name)) {
      return "the operator " + name;
    }
    for (Iterator<Expression> it = plan.expressions().iterator(); it.hasNext(); ) {
      String e = expression(it.next(), warehouse);
      if (e != null) {
        return e;
      }
    }
    for (Iterator<LogicalPlan> it = plan.children().iterator(); it.hasNext(); ) {
      String c = refusal(it.next(), warehouse);
      if (c != null) {
        return c;
      }
    }
    for (Iterator<QueryPlan<?>> it = plan.innerChildren().iterator(); it.hasNext(); ) {
      QueryPlan<?> inner = it.next();
      String c = inner instanceof LogicalPlan ? refusal((LogicalPlan) inner, warehouse) : null;
      if (c != null) {
        return c;
      }
    }
    return null;
  }

  static String expression(Expression e, File warehouse) {
    if (e instanceof CallMethodViaReflection) {
      return "reflect()/java_method() (calls any Java method)";
    }
    if (e instanceof SubqueryExpression) {
      String s = refusal(((SubqueryExpression) e).plan(), warehouse);
      if (s != null) {
        return s;
      }
    }
    for (Iterator<Expression> it = e.children().iterator(); it.hasNext(); ) {
      String c = expression(it.next(), warehouse);
      if (c != null) {
        return c;
      }
    }
    return null;
  }

  static String relation(LogicalRelation r, File warehouse) {
    if (r.catalogTable().isEmpty()) {
      String where = r.relation() instanceof HadoopFsRelation
          ? ((HadoopFsRelation) r.relation()).location().rootPaths().mkString(", ") : r.relation().toString();
      return "reading files by their path (" + where + ")";
    }
    String table = r.catalogTable().get().identifier().toString();
    if (!(r.relation() instanceof HadoopFsRelation)) {
      return "table " + table + " (not files of the warehouse)";
    }
    for (Iterator<Path> it = ((HadoopFsRelation) r.relation()).location().rootPaths().iterator(); it.hasNext(); ) {
      if (!inWarehouse(it.next().toUri(), warehouse)) {
        return "table " + table + " (its files are outside the warehouse)";
      }
    }
    return null;
  }

  /** A local path inside a table directory of the warehouse: <warehouse>/<name>/..., where
   * <name> does not start with '_' or '.' (so never _catalog/, where the security files are). */
  static boolean inWarehouse(URI location, File warehouse) {
    if (warehouse == null || location == null) {
      return false;
    }
    String scheme = location.getScheme();
    if (scheme != null && !scheme.equals("file")) {
      return false;
    }
    try {
      File f = new File(location.getPath()).getCanonicalFile();
      String root = warehouse.getPath() + File.separator;
      if (!f.getPath().startsWith(root)) {
        return false;
      }
      String first = f.getPath().substring(root.length()).split(File.separator.equals("\\") ? "\\\\" : File.separator, 2)[0];
      return !first.isEmpty() && !first.startsWith("_") && !first.startsWith(".");
    } catch (IOException e) {
      return false;
    }
  }
}
