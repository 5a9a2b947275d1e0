#!/usr/bin/env bash
# A real OpenStack (Debian bookworm's Zed packages) on 127.0.0.1 for the OpenStack provider's
# tests: keystone, glance, placement, barbican (simple_crypto secret store), nova (api,
# conductor, scheduler, compute with the `fake` virt driver), neutron (ML2 with neutron's own `test` mechanism driver, so ports bind without
# agents) and octavia (api + worker with the no-op amphora, compute and network drivers, as the
# upstream no-op test jobs run it, except that the API allocates VIPs as real neutron ports and
# checks listeners' TLS certificates in barbican for real), on MariaDB and RabbitMQ. Nothing runs as a system service,
# nothing is written outside the state directory, and everything listens on 127.0.0.1 only.
#
#   hack/openstack.sh install        apt packages (root or password-less sudo), idempotent
#   hack/openstack.sh start [DIR]    start (or find running) the cloud; prints its env file path
#   hack/openstack.sh stop [DIR]     stop every process and remove DIR
#
# DIR defaults to $RCP_CACHE_DIR/openstack-run. Starting is idempotent and serialised with a
# lock, so concurrent tests share one cloud. The databases of a first start are kept as a seed
# ($CACHE/openstack-zed-seed-<hash of this script>.tar), so later starts skip the schema work.
#
# Ports: MariaDB 13306, RabbitMQ 15672 (+15673 dist, 14369 epmd), keystone 15000, glance 19292,
# placement 18778, nova 18774, neutron 19696, octavia 19876, barbican 19311.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
CACHE="${RCP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rust-cloud-provider}"
CMD=${1:-start}
RUN=${2:-$CACHE/openstack-run}
PY=/usr/bin/python3
PASS=rcp-openstack-test
DB="mysql+pymysql://os:${PASS}@127.0.0.1:13306"
RABBIT="rabbit://rcp:${PASS}@127.0.0.1:15672/"
KS=http://127.0.0.1:15000
BARBICAN_KEK=$(printf 'rcp-barbican-test-kek-0123456789' | base64)

log() { printf '[openstack] %s\n' "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }

PACKAGES=(keystone glance-api placement-api nova-api nova-conductor nova-scheduler python3-nova
  neutron-server octavia-api octavia-worker barbican-api mariadb-server rabbitmq-server uwsgi-core
  uwsgi-plugin-python3 curl jq)

cmd_install() {
  local missing=() p
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then log "packages cached (${#PACKAGES[@]} present)"; return 0; fi
  local sudo=""
  [[ $(id -u) -ne 0 ]] && sudo=sudo
  if [[ -n "$sudo" ]] && ! sudo -n true 2>/dev/null; then
    die "missing ${missing[*]}: run as root, or as a user with password-less sudo, to install them"
  fi
  log "installing ${#missing[@]} packages: ${missing[*]}"
  local t0=$SECONDS
  # The packages must not start their services, nor ask for or set up databases.
  local had_policy=1
  [[ -e /usr/sbin/policy-rc.d ]] || had_policy=0
  if ((had_policy == 0)); then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
    $sudo chmod +x /usr/sbin/policy-rc.d
  fi
  for p in keystone nova neutron octavia placement glance barbican; do
    echo "$p-common $p/configure_db boolean false"
  done | $sudo debconf-set-selections
  echo "keystone keystone/configure_db boolean false" | $sudo debconf-set-selections
  local rc=0
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" \
    >"$CACHE/logs/openstack-apt.log" 2>&1 || {
      $sudo apt-get update >>"$CACHE/logs/openstack-apt.log" 2>&1
      $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" \
        >>"$CACHE/logs/openstack-apt.log" 2>&1 || rc=$?
    }
  ((had_policy == 0)) && $sudo rm -f /usr/sbin/policy-rc.d
  ((rc == 0)) || { tail -n 25 "$CACHE/logs/openstack-apt.log" >&2; die "apt-get install (log: $CACHE/logs/openstack-apt.log)"; }
  log "installed in $((SECONDS - t0)) s"
}

# ---------------------------------------------------------------------------------------------
# Configuration files.
authtoken() {
  cat <<EOF
[keystone_authtoken]
www_authenticate_uri = $KS/v3
auth_url = $KS/v3
auth_type = password
project_domain_name = Default
user_domain_name = Default
project_name = service
username = svc
password = $PASS
service_token_roles_required = true
memcached_servers =
# Each service keeps a validated token for 5 s (in process, without memcached): with no cache
# every request cost keystone a validation (~330 per OpenStack LB test, ~15 ms each, the
# largest share of keystone's CPU). A revoked token is refused within 5 s (the token-revocation
# test waits for the CCM's re-authentication, it does not time it).
token_cache_time = 5
EOF
}
service_auth() { # SECTION [ENDPOINT]
  cat <<EOF
[$1]
auth_type = password
auth_url = $KS/v3
project_domain_name = Default
user_domain_name = Default
project_name = service
username = svc
password = $PASS
region_name = RegionOne
${2:+endpoint_override = $2}
EOF
}

write_configs() {
  mkdir -p "$RUN"/{logs,keystone/fernet,keystone/cred,glance/images,nova/lock,neutron/lock,octavia/lock,placement,rabbit,home,barbican/home/.barbican}
  chmod 700 "$RUN/keystone/fernet" "$RUN/keystone/cred"
  cat >"$RUN/keystone/keystone.conf" <<EOF
[DEFAULT]
log_file = $RUN/logs/keystone.log
[database]
connection = $DB/keystone
[token]
provider = fernet
expiration = 3600
[fernet_tokens]
key_repository = $RUN/keystone/fernet
[credential]
key_repository = $RUN/keystone/cred
[cache]
enabled = true
backend = dogpile.cache.memory
# Users are not cached: a log-in that reads a disabled user while an admin re-enables it
# stores the disabled user after the update cleared the cache, and keystone then refuses the
# re-enabled user until the entry expires (10 min). The tests disable and re-enable users to
# revoke their tokens while the CCM logs in again (reproduced here with concurrent log-ins).
[identity]
caching = false
# bcrypt's fewest rounds (default 12): every log-in and every new user hashed a password for
# ~0.3-0.6 s of keystone's CPU (17 log-ins in one OpenStack LB test). Test passwords only.
password_hash_rounds = 4
# Role assignments likewise: an application credential made right after its user got a role
# in the project was refused once ("Could not find role assignment") with a stale entry.
[assignment]
caching = false
EOF
  cat >"$RUN/glance/glance-api.conf" <<EOF
[DEFAULT]
log_file = $RUN/logs/glance.log
bind_host = 127.0.0.1
bind_port = 19292
workers = 1
enabled_backends = fs:file
[database]
connection = $DB/glance
[glance_store]
default_backend = fs
[fs]
filesystem_store_datadir = $RUN/glance/images
[os_glance_staging_store]
filesystem_store_datadir = $RUN/glance/staging
[os_glance_tasks_store]
filesystem_store_datadir = $RUN/glance/tasks
[paste_deploy]
flavor = keystone
config_file = /etc/glance/glance-api-paste.ini
$(authtoken)
EOF
  cat >"$RUN/placement/placement.conf" <<EOF
[DEFAULT]
log_file = $RUN/logs/placement.log
[api]
auth_strategy = keystone
[placement_database]
connection = $DB/placement
$(authtoken)
EOF
  # barbican reads ~/.barbican/barbican.conf first (oslo.config's search path; its WSGI entry
  # takes no --config-file), so its HOME is its own directory.
  cat >"$RUN/barbican/home/.barbican/barbican.conf" <<EOF
[DEFAULT]
log_file = $RUN/logs/barbican.log
sql_connection = $DB/barbican
host_href = http://127.0.0.1:19311
db_auto_create = false
[secretstore]
namespace = barbican.secretstore.plugin
enabled_secretstore_plugins = store_crypto
[crypto]
namespace = barbican.crypto.plugin
enabled_crypto_plugins = simple_crypto
[simple_crypto_plugin]
# A fixed test key (the secrets of this cloud are test certificates).
kek = $BARBICAN_KEK
[queue]
enable = false
[keystone_notifications]
enable = false
[oslo_policy]
policy_dirs = /etc/barbican/policy.d
# The policies current OpenStack releases default to: a project member stores secrets (the
# legacy rules want barbican's own creator role).
enforce_new_defaults = true
$(authtoken)
EOF
  cat >"$RUN/nova/nova.conf" <<EOF
[DEFAULT]
log_file = $RUN/logs/nova.log
transport_url = $RABBIT
compute_driver = fake.FakeDriver
host = host-ovs-filter-active
my_ip = 127.0.0.1
enabled_apis = osapi_compute
osapi_compute_listen = 127.0.0.1
osapi_compute_listen_port = 18774
osapi_compute_workers = 1
vif_plugging_is_fatal = false
vif_plugging_timeout = 0
instance_usage_audit = false
heal_instance_info_cache_interval = -1
state_path = $RUN/nova
[api]
auth_strategy = keystone
# Small pages, so that every list the provider reads is paginated in the tests (nova's default
# is 1000; a list cut at a page made the route controller take live next hops for blackholes).
max_limit = 3
[wsgi]
api_paste_config = /etc/nova/api-paste.ini
[conductor]
workers = 1
[scheduler]
workers = 1
discover_hosts_in_cells_interval = 2
[api_database]
connection = $DB/nova_api
[database]
connection = $DB/nova
[oslo_concurrency]
lock_path = $RUN/nova/lock
[oslo_messaging_notifications]
driver = noop
[notifications]
notification_format = unversioned
[os_vif_ovs]
isolate_vif = false
$(service_auth placement http://127.0.0.1:18778)
$(service_auth neutron http://127.0.0.1:19696)
$(service_auth glance http://127.0.0.1:19292)
$(authtoken)
EOF
  cat >"$RUN/neutron/neutron.conf" <<EOF
[DEFAULT]
log_file = $RUN/logs/neutron.log
bind_host = 127.0.0.1
bind_port = 19696
api_workers = 1
rpc_workers = 1
rpc_state_report_workers = 0
core_plugin = ml2
service_plugins = router
auth_strategy = keystone
transport_url = $RABBIT
api_paste_config = /etc/neutron/api-paste.ini
allow_overlapping_ips = true
# Small pages (see nova's max_limit above).
allow_pagination = true
pagination_max_limit = 3
notify_nova_on_port_status_changes = false
notify_nova_on_port_data_changes = false
state_path = $RUN/neutron
[database]
connection = $DB/neutron
[oslo_concurrency]
lock_path = $RUN/neutron/lock
[oslo_messaging_notifications]
driver = noop
[agent]
root_helper = false
$(authtoken)
[ml2]
type_drivers = flat,vxlan
tenant_network_types = vxlan
mechanism_drivers = test
extension_drivers = port_security
[ml2_type_vxlan]
vni_ranges = 1:10000
[ml2_type_flat]
flat_networks = public
EOF
  # The amphora flow signs an (unused) amphora certificate even with the no-op drivers.
  mkdir -p "$RUN/octavia/ca" "$RUN/octavia/certs"
  openssl req -x509 -newkey rsa:2048 -passout pass:rcp-test-ca -days 30 -subj /CN=rcp-octavia-test-ca \
    -keyout "$RUN/octavia/ca/ca.key" -out "$RUN/octavia/ca/ca.pem" >/dev/null 2>&1 || die "openssl: test CA"
  cat >"$RUN/octavia/octavia.conf" <<EOF
[DEFAULT]
log_file = $RUN/logs/octavia.log
transport_url = $RABBIT
[api_settings]
bind_host = 127.0.0.1
bind_port = 19876
auth_strategy = keystone
enabled_provider_drivers = amphora:The Octavia Amphora driver (no-op amphora here)
default_provider_driver = amphora
# Small pages (see nova's max_limit above).
pagination_max_limit = 3
[database]
connection = $DB/octavia
[controller_worker]
amphora_driver = amphora_noop_driver
compute_driver = compute_noop_driver
network_driver = network_noop_driver
volume_driver = volume_noop_driver
image_driver = image_noop_driver
loadbalancer_topology = SINGLE
amp_image_tag = amphora
amp_flavor_id = 1
amp_boot_network_list = 00000000-0000-0000-0000-000000000000
client_ca = $RUN/octavia/ca/ca.pem
[task_flow]
jobboard_enabled = false
[oslo_messaging]
topic = octavia_prov
[oslo_concurrency]
lock_path = $RUN/octavia/lock
[certificates]
# Listeners' TLS certificates live in barbican, as in a real cloud: the API grants its service
# user read access with the caller's token and checks each reference; the worker reads them.
cert_manager = barbican_cert_manager
region_name = RegionOne
endpoint_type = public
cert_generator = local_cert_generator
storage_path = $RUN/octavia/certs
ca_certificate = $RUN/octavia/ca/ca.pem
ca_private_key = $RUN/octavia/ca/ca.key
ca_private_key_passphrase = rcp-test-ca
[neutron]
endpoint = http://127.0.0.1:19696
region_name = RegionOne
$(service_auth service_auth)
$(authtoken)
EOF
  # The API allocates each VIP as a real neutron port (the allowed-address-pairs driver, checking
  # subnets and ports for real); the worker's plug/unplug steps stay no-ops (no amphorae here).
  sed 's/^network_driver = network_noop_driver$/network_driver = allowed_address_pairs_driver/' \
    "$RUN/octavia/octavia.conf" >"$RUN/octavia/octavia-api.conf"
}

# ---------------------------------------------------------------------------------------------
# Processes: each writes $RUN/<name>.pid and logs to $RUN/logs/<name>.out.
spawn() { # NAME CMD...
  local name=$1; shift
  setsid "$@" >"$RUN/logs/$name.out" 2>&1 </dev/null 9>&- &
  echo $! >"$RUN/$name.pid"
}
wait_http() { # NAME URL SECONDS
  local i
  for ((i = 0; i < $3 * 5; i++)); do
    if curl -s -o /dev/null --max-time 2 "$2"; then return 0; fi
    if [[ -f "$RUN/$1.pid" ]] && ! kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null; then
      tail -n 30 "$RUN/logs/$1.out" >&2; die "$1 exited during start (log: $RUN/logs/$1.out)"
    fi
    sleep 0.2
  done
  tail -n 30 "$RUN/logs/$1.out" >&2
  die "$1 did not answer on $2 within $3 s (logs: $RUN/logs/)"
}
uwsgi_app() { # NAME PORT WSGI-SCRIPT PYARGV ENV...
  local name=$1 port=$2 script=$3 pyargv=$4; shift 4
  spawn "$name" env "$@" uwsgi --plugin python3 --http-socket "127.0.0.1:$port" --wsgi-file "$script" \
    --processes 1 --threads 4 --master --die-on-term --need-app --lazy-apps --buffer-size 65535 \
    --add-header 'Connection: close' \
    --pyargv "$pyargv"
}

start_mariadb() {
  if [[ ! -d "$RUN/mysql/mysql" ]]; then
    mkdir -p "$RUN/mysql"
    if [[ -f "$SEED" ]]; then
      tar -C "$RUN" -xf "$SEED"
    else
      mariadb-install-db --no-defaults --datadir="$RUN/mysql" --user="$(id -un)" \
        --auth-root-authentication-method=normal --skip-test-db >"$RUN/logs/mysql-install.out" 2>&1 \
        || die "mariadb-install-db (log: $RUN/logs/mysql-install.out)"
    fi
  fi
  spawn mysql mariadbd --no-defaults --datadir="$RUN/mysql" --socket="$RUN/mysql.sock" --port=13306 \
    --bind-address=127.0.0.1 --user="$(id -un)" --pid-file="$RUN/mysql/mysqld.pid" \
    --skip-name-resolve --innodb-buffer-pool-size=64M --innodb-flush-log-at-trx-commit=0 \
    --max-connections=500 --log-error="$RUN/logs/mysql.err"
  local i
  for ((i = 0; i < 150; i++)); do
    mariadb --no-defaults --socket="$RUN/mysql.sock" -uroot -e 'select 1' >/dev/null 2>&1 && return 0
    kill -0 "$(cat "$RUN/mysql.pid")" 2>/dev/null || { cat "$RUN/logs/mysql.err" >&2; die "mariadbd exited"; }
    sleep 0.2
  done
  die "mariadbd did not start (log: $RUN/logs/mysql.err)"
}
sql() { mariadb --no-defaults --socket="$RUN/mysql.sock" -uroot -e "$1"; }
sql_value() { mariadb --no-defaults --socket="$RUN/mysql.sock" -uroot -N -B -e "$1"; }

start_rabbit() {
  mkdir -p "$RUN/rabbit/mnesia" "$RUN/rabbit/log"
  echo '[].' >"$RUN/rabbit/enabled_plugins"
  cat >"$RUN/rabbit/rabbitmq.conf" <<EOF
loopback_users = none
listeners.tcp.default = 127.0.0.1:15672
EOF
  spawn rabbit env HOME="$RUN/home" RABBITMQ_NODENAME=rabbit@localhost RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
    RABBITMQ_NODE_PORT=15672 RABBITMQ_DIST_PORT=15673 ERL_EPMD_ADDRESS=127.0.0.1 ERL_EPMD_PORT=14369 \
    RABBITMQ_MNESIA_BASE="$RUN/rabbit/mnesia" RABBITMQ_LOG_BASE="$RUN/rabbit/log" \
    RABBITMQ_FEATURE_FLAGS_FILE="$RUN/rabbit/feature_flags" RABBITMQ_CONFIG_FILE="$RUN/rabbit/rabbitmq" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$RUN/rabbit/enabled_plugins" RABBITMQ_PID_FILE="$RUN/rabbit/pid" \
    /usr/lib/rabbitmq/bin/rabbitmq-server
}
rabbitctl() {
  env HOME="$RUN/home" RABBITMQ_NODENAME=rabbit@localhost ERL_EPMD_ADDRESS=127.0.0.1 ERL_EPMD_PORT=14369 \
    /usr/lib/rabbitmq/bin/rabbitmqctl "$@"
}

# keystone REST helpers (admin token in $TOKEN).
ks() { # METHOD PATH [JSON]
  curl -sf -X "$1" -H "X-Auth-Token: $TOKEN" -H 'Content-Type: application/json' "$KS/v3$2" ${3:+-d "$3"}
}
ks_id() { # PATH KEY NAME -> id of the named object (list query)
  ks GET "$1?name=$3" | jq -r ".$2[0].id // empty"
}

bootstrap_keystone() {
  TOKEN=$(curl -sf -i -H 'Content-Type: application/json' -d "{\"auth\":{\"identity\":{\"methods\":[\"password\"],\"password\":{\"user\":{\"name\":\"admin\",\"domain\":{\"id\":\"default\"},\"password\":\"$PASS\"}}},\"scope\":{\"project\":{\"name\":\"admin\",\"domain\":{\"id\":\"default\"}}}}}" \
    "$KS/v3/auth/tokens" | tr -d '\r' | awk -F': ' 'tolower($1)=="x-subject-token"{print $2}')
  [[ -n "$TOKEN" ]] || die "keystone: no admin token"
  local svc_project svc_user admin_role
  svc_project=$(ks POST /projects '{"project":{"name":"service","domain_id":"default"}}' | jq -r .project.id)
  svc_user=$(ks POST /users "{\"user\":{\"name\":\"svc\",\"domain_id\":\"default\",\"password\":\"$PASS\"}}" | jq -r .user.id)
  admin_role=$(ks_id /roles roles admin)
  ks PUT "/projects/$svc_project/users/$svc_user/roles/$admin_role" >/dev/null
  ks POST /roles '{"role":{"name":"service"}}' >/dev/null
  ks PUT "/projects/$svc_project/users/$svc_user/roles/$(ks_id /roles roles service)" >/dev/null
  ks POST /roles '{"role":{"name":"load-balancer_member"}}' >/dev/null
  local name type url sid
  while read -r name type url; do
    sid=$(ks POST /services "{\"service\":{\"name\":\"$name\",\"type\":\"$type\"}}" | jq -r .service.id)
    for iface in public internal admin; do
      ks POST /endpoints "{\"endpoint\":{\"service_id\":\"$sid\",\"interface\":\"$iface\",\"region_id\":\"RegionOne\",\"url\":\"$url\"}}" >/dev/null
    done
  done <<EOF
glance image http://127.0.0.1:19292
placement placement http://127.0.0.1:18778
nova compute http://127.0.0.1:18774/v2.1
neutron network http://127.0.0.1:19696
octavia load-balancer http://127.0.0.1:19876
barbican key-manager http://127.0.0.1:19311
EOF
}

first_setup() {
  log "first start: creating databases and schemas (kept as a seed for later starts)"
  local d
  for d in keystone glance placement nova_api nova nova_cell0 neutron octavia barbican; do
    sql "CREATE DATABASE $d CHARACTER SET utf8mb4;"
  done
  sql "CREATE USER 'os'@'127.0.0.1' IDENTIFIED BY '$PASS'; GRANT ALL ON *.* TO 'os'@'127.0.0.1'; FLUSH PRIVILEGES;"
  local kc=(--config-file "$RUN/keystone/keystone.conf")
  keystone-manage "${kc[@]}" db_sync >>"$RUN/logs/setup.out" 2>&1 || die "keystone db_sync"
  keystone-manage "${kc[@]}" fernet_setup --keystone-user "$(id -un)" --keystone-group "$(id -gn)" >>"$RUN/logs/setup.out" 2>&1
  keystone-manage "${kc[@]}" credential_setup --keystone-user "$(id -un)" --keystone-group "$(id -gn)" >>"$RUN/logs/setup.out" 2>&1
  keystone-manage "${kc[@]}" bootstrap --bootstrap-password "$PASS" --bootstrap-admin-url "$KS/v3/" \
    --bootstrap-internal-url "$KS/v3/" --bootstrap-public-url "$KS/v3/" --bootstrap-region-id RegionOne \
    >>"$RUN/logs/setup.out" 2>&1 || die "keystone bootstrap"
  glance-manage --config-file "$RUN/glance/glance-api.conf" db_sync >>"$RUN/logs/setup.out" 2>&1 || die "glance db_sync"
  placement-manage --config-file "$RUN/placement/placement.conf" db sync >>"$RUN/logs/setup.out" 2>&1 || die "placement db sync"
  local nc=(--config-file "$RUN/nova/nova.conf")
  nova-manage "${nc[@]}" api_db sync >>"$RUN/logs/setup.out" 2>&1 || die "nova api_db sync"
  nova-manage "${nc[@]}" cell_v2 map_cell0 --database_connection "$DB/nova_cell0" >>"$RUN/logs/setup.out" 2>&1 || die "nova map_cell0"
  nova-manage "${nc[@]}" cell_v2 create_cell --name cell1 >>"$RUN/logs/setup.out" 2>&1 || die "nova create_cell"
  nova-manage "${nc[@]}" db sync >>"$RUN/logs/setup.out" 2>&1 || die "nova db sync"
  neutron-db-manage --config-file "$RUN/neutron/neutron.conf" upgrade heads >>"$RUN/logs/setup.out" 2>&1 || die "neutron upgrade heads"
  octavia-db-manage --config-file "$RUN/octavia/octavia.conf" upgrade head >>"$RUN/logs/setup.out" 2>&1 || die "octavia upgrade head"
  HOME="$RUN/barbican/home" barbican-manage db upgrade --db-url "$DB/barbican" >>"$RUN/logs/setup.out" 2>&1 || die "barbican db upgrade"
}

cmd_start() {
  mkdir -p "$RUN" "$CACHE/logs"
  exec 9>"$RUN.lock"
  flock 9
  # A running cloud answers keystone and Octavia; on a loaded machine (tests in parallel, each
  # with its own API server) an answer can take seconds, and restarting the cloud under the
  # tests that use it fails them all: a minute of patience before it counts as down.
  if [[ -f "$RUN/env" ]]; then
    local try
    for ((try = 0; try < 6; try++)); do
      if curl -s -o /dev/null --max-time 10 "$KS/v3" && curl -s -o /dev/null --max-time 10 http://127.0.0.1:19876/; then
        echo "$RUN/env"; return 0
      fi
      sleep 1
    done
  fi
  start_cloud
}

# Starts every service from the seed (a first start makes the seed, then starts again from it).
start_cloud() {
  cmd_stop_locked
  local t0=$SECONDS
  SEED="$CACHE/openstack-zed-seed-$(sha256sum "$0" | cut -c1-12).tar"
  write_configs
  local fresh=0
  [[ -f "$SEED" ]] || fresh=1
  start_mariadb
  start_rabbit
  ((fresh)) && first_setup
  uwsgi_app keystone 15000 /usr/bin/keystone-wsgi-public "" OS_KEYSTONE_CONFIG_FILES="$RUN/keystone/keystone.conf"
  wait_http keystone "$KS/v3" 60
  if ((fresh)); then bootstrap_keystone; fi
  # RabbitMQ: wait for the node, then our user.
  local i
  for ((i = 0; i < 150; i++)); do rabbitctl -q status >/dev/null 2>&1 && break; sleep 0.2; done
  rabbitctl -q status >/dev/null 2>&1 || { tail -n 30 "$RUN/logs/rabbit.out" >&2; die "rabbitmq did not start"; }
  rabbitctl -q add_user rcp "$PASS" >/dev/null 2>&1 || true
  rabbitctl -q set_permissions -p / rcp '.*' '.*' '.*' >/dev/null
  uwsgi_app placement 18778 /usr/bin/placement-api "" OS_PLACEMENT_CONFIG_DIR="$RUN/placement"
  spawn glance $PY /usr/bin/glance-api --config-file "$RUN/glance/glance-api.conf"
  # -O: the `test` mechanism driver (neutron's unit-test tree) asserts test-only invariants.
  spawn neutron $PY -O /usr/bin/neutron-server --config-file "$RUN/neutron/neutron.conf"
  spawn nova-api $PY /usr/bin/nova-api --config-file "$RUN/nova/nova.conf"
  spawn nova-conductor $PY /usr/bin/nova-conductor --config-file "$RUN/nova/nova.conf"
  spawn nova-scheduler $PY /usr/bin/nova-scheduler --config-file "$RUN/nova/nova.conf"
  local compute_since
  compute_since=$(sql_value "SELECT UTC_TIMESTAMP()")
  spawn nova-compute $PY -c 'import sys; from nova.cmd.compute import main; sys.exit(main())' --config-file "$RUN/nova/nova.conf"
  spawn octavia-worker $PY /usr/bin/octavia-worker --config-file "$RUN/octavia/octavia.conf"
  uwsgi_app octavia 19876 /usr/bin/octavia-wsgi "--config-file $RUN/octavia/octavia-api.conf"
  uwsgi_app barbican 19311 /usr/bin/barbican-wsgi-api "" HOME="$RUN/barbican/home"
  wait_http placement http://127.0.0.1:18778/ 60
  wait_http glance http://127.0.0.1:19292/ 60
  wait_http neutron http://127.0.0.1:19696/ 90
  wait_http nova-api http://127.0.0.1:18774/ 90
  wait_http octavia http://127.0.0.1:19876/ 60
  wait_http barbican http://127.0.0.1:19311/ 60
  # The compute host must be mapped to cell1 before the scheduler can place servers on it.
  for ((i = 0; i < 300; i++)); do
    [[ $(sql_value "SELECT count(*) FROM nova_api.host_mappings") -gt 0 ]] && break
    if [[ $(sql_value "SELECT count(*) FROM nova.compute_nodes") -gt 0 ]]; then
      nova-manage --config-file "$RUN/nova/nova.conf" cell_v2 discover_hosts >>"$RUN/logs/setup.out" 2>&1 || true
    fi
    sleep 0.2
  done
  [[ $(sql_value "SELECT count(*) FROM nova_api.host_mappings") -gt 0 ]] || die "nova-compute did not register (logs: $RUN/logs/nova.log)"
  # ... and its inventory must be in placement.
  for ((i = 0; i < 300; i++)); do
    [[ $(sql_value "SELECT count(*) FROM placement.inventories") -gt 0 ]] && break
    sleep 0.2
  done
  [[ $(sql_value "SELECT count(*) FROM placement.inventories") -gt 0 ]] || die "nova-compute reported no inventory to placement (logs: $RUN/logs/nova.log)"
  # ... and the scheduler must see it up: a heartbeat of this start (the seed's record is old).
  local up="SELECT count(*) FROM nova.services WHERE \`binary\` = 'nova-compute' AND deleted = 0 AND updated_at >= '$compute_since'"
  for ((i = 0; i < 300; i++)); do
    [[ $(sql_value "$up") -gt 0 ]] && break
    sleep 0.2
  done
  [[ $(sql_value "$up") -gt 0 ]] || die "nova-compute sent no heartbeat (logs: $RUN/logs/nova.log)"
  if ((fresh)); then
    # Seed: the databases and keys of a cloud that has just been bootstrapped, copied from a
    # database that was shut down cleanly (a copy of a running InnoDB, even after FLUSH TABLES,
    # can fail its crash recovery at the next start: "Failing assertion: tail.trx_no <=
    # last_trx_no" was seen). Then everything starts again from the seed.
    log "keeping the seed $SEED; starting again from it"
    mariadb-admin --no-defaults --socket="$RUN/mysql.sock" -uroot shutdown >>"$RUN/logs/setup.out" 2>&1 \
      || die "mariadb did not shut down cleanly for the seed (log: $RUN/logs/mysql.err)"
    local mpid i
    mpid=$(cat "$RUN/mysql.pid")
    for ((i = 0; i < 600; i++)); do kill -0 "$mpid" 2>/dev/null || break; sleep 0.1; done
    ! kill -0 "$mpid" 2>/dev/null || die "mariadbd still running 60 s after its shutdown (log: $RUN/logs/mysql.err)"
    tar -C "$RUN" -cf "$SEED.tmp" mysql keystone/fernet keystone/cred && mv "$SEED.tmp" "$SEED"
    # Seeds of earlier versions of this script are never used again (~240 MB each).
    find "$CACHE" -maxdepth 1 -name 'openstack-zed-seed-*.tar' ! -name "$(basename "$SEED")" -delete
    start_cloud
    return
  fi
  cat >"$RUN/env" <<EOF
OS_AUTH_URL=$KS/v3
OS_REGION_NAME=RegionOne
OS_USERNAME=admin
OS_PASSWORD=$PASS
OS_PROJECT_NAME=admin
OS_USER_DOMAIN_NAME=Default
OS_PROJECT_DOMAIN_NAME=Default
RCP_OPENSTACK_RUN=$RUN
EOF
  log "started in $((SECONDS - t0)) s"
  echo "$RUN/env"
}

cmd_stop_locked() {
  local f pid
  for f in "$RUN"/*.pid; do
    [[ -f "$f" ]] || continue
    pid=$(cat "$f")
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  done
  for f in "$RUN"/*.pid; do
    [[ -f "$f" ]] || continue
    pid=$(cat "$f")
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  done
  # epmd (Erlang's port mapper, on our own port) is daemonised by RabbitMQ outside its process
  # group: ask it to stop.
  if [[ -x /usr/bin/epmd ]]; then ERL_EPMD_PORT=14369 /usr/bin/epmd -kill >/dev/null 2>&1 || true; fi
  rm -rf "$RUN"
}

cmd_stop() {
  mkdir -p "$(dirname "$RUN")"
  exec 9>"$RUN.lock"
  flock 9
  cmd_stop_locked
}

case "$CMD" in
  install) mkdir -p "$CACHE/logs"; cmd_install ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  *) die "usage: $0 install|start|stop [DIR]" ;;
esac
