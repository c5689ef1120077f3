# Shared by scripts/pulsar.sh and scripts/iceberg_rest.sh: resolve a pom's runtime jars from Maven Central into a
# directory. Source it; it defines maven_fetch.

# maven_fetch NAME POM LIB MARKER_JAR LOG_NAME [MAVEN_ARGS...]: the jars of POM into LIB, unless MARKER_JAR is
# there already. Into a fresh directory first, renamed when complete: a broken download never looks like a
# fetched release. Maven's output goes to var/logs/LOG_NAME, shown only on failure.
maven_fetch() {
    local name="$1" pom="$2" lib="$3" marker="$4" log_name="$5"
    shift 5
    if [ -f "$lib/$marker" ]; then
        return 0
    fi
    if ! command -v mvn >/dev/null 2>&1; then
        echo "streamoffload: Maven ('mvn') is needed to fetch $name; Debian: apt-get install -y maven" >&2
        return 1
    fi
    echo "== fetching $name from Maven Central into $lib"
    local partial="$lib.partial.$$"
    rm -rf "$partial"
    mkdir -p "$(dirname "$lib")" "$ROOT/var/logs"
    local log="$ROOT/var/logs/$log_name"
    if ! mvn -B -ntp -Dstyle.color=never -f "$pom" dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory="$partial" "$@" >"$log" 2>&1; then
        rm -rf "$partial"
        tail -n 40 "$log" >&2
        echo "streamoffload: resolving $name from Maven Central failed (log: $log)" >&2
        return 1
    fi
    rm -rf "$lib"
    mv "$partial" "$lib"
    echo "== $name: $(find "$lib" -name '*.jar' | wc -l) jars, $(du -sh "$lib" | cut -f1)"
}
