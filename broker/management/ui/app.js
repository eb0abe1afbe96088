// quorumqueue's management web UI: views drawn from the management HTTP API.
//
// How it works: the page keeps the user's credentials in sessionStorage (as
// RabbitMQ's UI does) and sends them as HTTP basic auth with every /api/ request.
// The hash names the view (#/overview, #/queues, #/queue/VHOST/NAME, ...); each
// view fetches what it shows and builds the DOM with el() (text nodes only: no
// server value is ever parsed as HTML). Views that show counts refresh every
// REFRESH_MS; the overview's chart plots message_stats' publish and deliver rates.
"use strict";

const REFRESH_MS = 5000;
const AUTH_KEY = "quorumqueue-auth";
let timer = null;
let chart = null;

// ---------------------------------------------------------------- helpers

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    // through the CSSOM: the Content-Security-Policy (style-src 'self') refuses
    // style attributes set as markup
    else if (key === "style") node.style.cssText = value;
    else if (value !== null && value !== undefined && value !== false) node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function table(headers, rows) {
  const none = el("tr", {}, el("td", {colspan: headers.length, class: "muted"}, "None."));
  return el("table", {},
    el("thead", {}, el("tr", {}, headers.map(h => el("th", {}, h)))),
    el("tbody", {}, rows.length ? rows : none));
}

function num(value, attrs) {
  return el("td", Object.assign({class: "num"}, attrs || {}), value === undefined ? "" : value);
}

function rate(details) {
  return details ? details.rate + "/s" : "";
}

function enc(part) {
  return encodeURIComponent(part);
}

function show(...nodes) {
  const main = document.getElementById("main");
  main.replaceChildren(...nodes);
}

function showError(text) {
  const box = document.getElementById("error");
  box.textContent = text;
  box.hidden = !text;
}

// ---------------------------------------------------------------- the API

function credentials() {
  return sessionStorage.getItem(AUTH_KEY);
}

async function api(method, path, body) {
  // X-Requested-With: the API then answers 401 without a WWW-Authenticate
  // challenge, so the browser shows no login dialog of its own (app.py)
  const headers = {"Authorization": "Basic " + credentials(),
                   "X-Requested-With": "XMLHttpRequest"};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch("/api" + path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body)});
  if (response.status === 401 && method === "GET" && path === "/whoami") {
    throw new Error("Login failed");
  }
  const text = await response.text();
  const value = text ? JSON.parse(text) : null;
  if (!response.ok) {
    throw new Error(response.status + " " + (value && value.reason || response.statusText));
  }
  return value;
}

const get = path => api("GET", path);

// ---------------------------------------------------------------- login

function loginView() {
  const form = el("form", {class: "login", id: "login-form"},
    el("h1", {}, "Log in"),
    el("label", {}, "Username ", el("input", {name: "username", id: "username", autocomplete: "username"})),
    el("label", {}, "Password ", el("input", {name: "password", id: "password", type: "password",
                                              autocomplete: "current-password"})),
    el("button", {type: "submit", id: "login"}, "Log in"));
  form.addEventListener("submit", async event => {
    event.preventDefault();
    const data = new FormData(form);
    const pair = data.get("username") + ":" + data.get("password");
    sessionStorage.setItem(AUTH_KEY, btoa(unescape(encodeURIComponent(pair))));
    try {
      await get("/whoami");
      showError("");
      route();  // the view the hash names (the overview by default)
    } catch (error) {
      sessionStorage.removeItem(AUTH_KEY);
      showError(error.message);
    }
  });
  show(form);
}

// ---------------------------------------------------------------- overview

async function overviewView(first) {
  const [overview, nodes] = await Promise.all([get("/overview"), get("/nodes").catch(() => null)]);
  const totals = overview.queue_totals || {};
  const objects = overview.object_totals || {};
  const stats = overview.message_stats || {};
  if (first || !chart) {
    const canvas = el("canvas", {id: "rates-chart", width: 700, height: 220});
    chart = new RateChart(canvas, [
      {key: "publish", label: "publish", color: "#c60"},
      {key: "deliver_get", label: "deliver / get", color: "#06c"},
      {key: "ack", label: "ack", color: "#393"}], 300);
    show(
      el("h1", {}, "Overview: " + overview.cluster_name),
      el("h2", {}, "Totals"), el("div", {id: "totals"}),
      el("h2", {}, "Message rates (all nodes)"),
      el("div", {class: "legend"}, chart.series.map(s =>
        el("span", {style: "color:" + s.color}, "\u25A0 " + s.label))),
      canvas,
      el("h2", {}, "Nodes"), el("div", {id: "nodes"}));
  }
  const detail = key => (stats[key + "_details"] || {}).rate || 0;
  chart.add(Date.now() / 1000, {publish: detail("publish"), deliver_get: detail("deliver_get"),
                                ack: detail("ack")});
  document.getElementById("totals").replaceChildren(table(
    ["ready", "unacked", "total", "publish", "deliver/get", "ack", "queues", "connections",
     "channels", "consumers", "exchanges"],
    [el("tr", {}, num(totals.messages_ready, {id: "total-ready"}),
        num(totals.messages_unacknowledged), num(totals.messages),
        num(rate(stats.publish_details), {id: "total-publish"}),
        num(rate(stats.deliver_get_details)),
        num(rate(stats.ack_details)), num(objects.queues), num(objects.connections),
        num(objects.channels), num(objects.consumers), num(objects.exchanges))]));
  document.getElementById("nodes").replaceChildren(nodes === null
    ? el("p", {class: "muted"}, "Listing nodes needs the monitoring tag.")
    : table(["name", "running", "memory used", "disk free", "uptime (s)"],
            nodes.map(n => el("tr", {},
              el("td", {}, n.name + (n.name === overview.node ? " (this node)" : "")),
              el("td", {class: n.running ? "ok" : "bad"}, n.running ? "running" : "down"),
              num(n.mem_used === undefined ? "" : Math.round(n.mem_used / 1048576) + " MiB"),
              num(n.disk_free === undefined ? "" : Math.round(n.disk_free / 1073741824) + " GiB"),
              num(n.uptime === undefined ? "" : Math.round(n.uptime / 1000))))));
}

// ---------------------------------------------------------------- queues

async function queuesView(first) {
  const queues = await get("/queues");
  const listing = el("div", {id: "queues-table"},
    table(["vhost", "name", "type", "leader", "members", "ready", "unacked", "total",
           "consumers", "length rate", "incoming", "deliver / get", "ack", "policy"],
      queues.map(q => el("tr", {"data-queue": q.name, "data-vhost": q.vhost},
        el("td", {}, q.vhost),
        el("td", {}, el("a", {href: "#/queue/" + enc(q.vhost) + "/" + enc(q.name)}, q.name)),
        el("td", {class: "type"}, q.type),
        el("td", {}, q.leader || q.node || ""),
        el("td", {}, (q.members || [q.node]).join(", ")),
        num(q.messages_ready, {class: "num ready"}),
        num(q.messages_unacknowledged, {class: "num unacked"}),
        num(q.messages),
        num(q.consumers),
        num(rate(q.messages_details)),
        // RabbitMQ's "Message rates" columns: the cluster's (every node's clients)
        num(rate((q.message_stats || {}).publish_details), {class: "num incoming"}),
        num(rate((q.message_stats || {}).deliver_get_details), {class: "num deliver-get"}),
        num(rate((q.message_stats || {}).ack_details), {class: "num ack"}),
        el("td", {}, [q.policy, q.operator_policy].filter(Boolean).join(" + "))))));
  const shown = document.getElementById("queues-table");
  if (!first && shown) {
    shown.replaceWith(listing);  // a refresh keeps the form below as the user left it
    return;
  }
  const vhosts = (await get("/vhosts")).map(v => v.name);
  show(el("h1", {}, "Queues"), listing, el("h2", {}, "Add a new queue"), addQueueForm(vhosts));
}

// RabbitMQ's "Add a new queue" form: virtual host, type, name, durability, auto
// delete and typed arguments, sent as PUT /api/queues/VHOST/NAME with x-queue-type
// among the arguments (a quorum queue is always durable: the durability choice goes).
function argumentRow() {
  return el("div", {class: "argument"},
    el("input", {class: "arg-key", placeholder: "x-max-length", size: 24}), " = ",
    el("input", {class: "arg-value", size: 16}), " ",
    el("select", {class: "arg-type"},
      el("option", {value: "string"}, "String"),
      el("option", {value: "number"}, "Number"),
      el("option", {value: "boolean"}, "Boolean")));
}

function argumentValue(row) {
  const key = row.querySelector(".arg-key").value.trim();
  const text = row.querySelector(".arg-value").value.trim();
  const type = row.querySelector(".arg-type").value;
  if (type === "number") {
    if (text === "" || !Number.isFinite(Number(text))) {
      throw new Error("argument " + key + ": '" + text + "' is not a number");
    }
    return [key, Number(text)];
  }
  if (type === "boolean") {
    if (text !== "true" && text !== "false") {
      throw new Error("argument " + key + ": expected true or false, got '" + text + "'");
    }
    return [key, text === "true"];
  }
  return [key, text];
}

function addQueueForm(vhosts) {
  const durability = el("label", {id: "new-queue-durability"}, "Durability ",
    el("select", {name: "durable", id: "new-queue-durable"},
      el("option", {value: "true"}, "Durable"),
      el("option", {value: "false"}, "Transient")));
  const type = el("select", {name: "type", id: "new-queue-type"},
    el("option", {value: "classic"}, "Classic"),
    el("option", {value: "quorum"}, "Quorum"));
  type.addEventListener("change", () => { durability.hidden = type.value === "quorum"; });
  const argumentsBox = el("div", {id: "new-queue-arguments"}, argumentRow());
  const status = el("p", {id: "new-queue-status", class: "muted"});
  const form = el("form", {id: "add-queue", class: "add-queue"},
    el("label", {}, "Virtual host ", el("select", {name: "vhost", id: "new-queue-vhost"},
      vhosts.map(name => el("option", {value: name}, name)))),
    el("label", {}, "Type ", type),
    el("label", {}, "Name ", el("input", {name: "name", id: "new-queue-name", size: 40})),
    durability,
    el("label", {}, "Auto delete ", el("select", {name: "auto_delete", id: "new-queue-auto-delete"},
      el("option", {value: "false"}, "No"),
      el("option", {value: "true"}, "Yes"))),
    el("fieldset", {}, el("legend", {}, "Arguments"), argumentsBox,
      el("button", {type: "button", id: "new-queue-add-argument",
                    onclick: () => argumentsBox.append(argumentRow())}, "Add argument")),
    el("button", {type: "submit", id: "new-queue-declare"}, "Add queue"),
    status);
  form.addEventListener("submit", async event => {
    event.preventDefault();
    const data = new FormData(form);
    const name = data.get("name").trim();
    status.textContent = "";
    try {
      if (!name) throw new Error("Name: a queue needs a name");
      const args = {};
      for (const row of argumentsBox.querySelectorAll(".argument")) {
        if (!row.querySelector(".arg-key").value.trim()) continue;  // an empty row
        const [key, value] = argumentValue(row);
        args[key] = value;
      }
      args["x-queue-type"] = type.value;
      const quorum = type.value === "quorum";
      await api("PUT", "/queues/" + enc(data.get("vhost")) + "/" + enc(name), {
        durable: quorum || data.get("durable") === "true",
        auto_delete: data.get("auto_delete") === "true", arguments: args});
      showError("");
      status.textContent = "Queue '" + name + "' declared in vhost '" + data.get("vhost") + "'.";
      form.querySelector("#new-queue-name").value = "";
      argumentsBox.replaceChildren(argumentRow());
      refresh(false);
    } catch (error) {
      showError(error.message);
    }
  });
  return form;
}

async function queueView(first, vhost, name) {
  const path = "/queues/" + enc(vhost) + "/" + enc(name);
  const q = await get(path);
  const consumers = (await get("/consumers/" + enc(vhost)))
    .filter(c => c.queue && c.queue.name === name);
  if (first) {
    show(el("h1", {}, "Queue " + name + " (vhost " + vhost + ")"),
      el("div", {id: "queue-facts"}),
      el("h2", {}, "Message rates (all nodes)"), el("div", {id: "queue-rates"}),
      el("h2", {}, "Raft members"), el("div", {id: "queue-members"}),
      el("h2", {}, "Consumers"), el("div", {id: "queue-consumers"}),
      el("h2", {}, "Get messages"), getForm(path),
      el("div", {id: "got"}),
      el("h2", {}, "Purge or delete"),
      el("button", {id: "purge", type: "button", onclick: () => purge(path)}, "Purge messages"),
      " ",
      el("button", {id: "delete", type: "button", onclick: () => remove(path, name)}, "Delete queue"));
  }
  const policy = JSON.stringify(q.effective_policy_definition || {});
  // dead letters held by at-least-once dead lettering (they count in the total), and
  // the single active consumer (RabbitMQ's single_active_consumer_ctag for quorum
  // queues, single_active_consumer_tag for classic ones)
  const active = q.single_active_consumer_ctag || q.single_active_consumer_tag || "";
  document.getElementById("queue-facts").replaceChildren(table(
    ["type", "state", "ready", "unacked", "dead letters held", "total", "active consumer",
     "length rate", "policy", "operator policy", "effective policy definition", "arguments"],
    [el("tr", {}, el("td", {}, q.type), el("td", {}, q.state),
        num(q.messages_ready, {id: "q-ready"}), num(q.messages_unacknowledged, {id: "q-unacked"}),
        num(q.messages_dlx, {id: "q-dlx"}),
        num(q.messages, {id: "q-total"}), el("td", {id: "q-active-consumer"}, active),
        num(rate(q.messages_details)),
        el("td", {}, q.policy || ""), el("td", {}, q.operator_policy || ""),
        el("td", {}, policy), el("td", {}, JSON.stringify(q.arguments || {})))]));
  document.getElementById("queue-rates").replaceChildren(messageRates(q.message_stats || {}));
  document.getElementById("queue-members").replaceChildren(q.type === "quorum"
    ? raftTable(await get(path + "/raft"))
    : el("p", {class: "muted"}, "A " + q.type + " queue has no Raft group: it lives on " +
         q.node + "."));
  document.getElementById("queue-consumers").replaceChildren(consumers.length
    ? table(["tag", "connection", "channel", "ack required", "prefetch", "exclusive"],
        consumers.map(c => el("tr", {},
          el("td", {}, c.consumer_tag), el("td", {}, c.channel_details.connection_name),
          num(c.channel_details.number), el("td", {}, String(c.ack_required)),
          num(c.prefetch_count), el("td", {}, String(c.exclusive)))))
    : el("p", {class: "muted"}, "No consumers (consumers on other nodes are listed there)."));
}

// A queue's message_stats (every node's clients, summed by the API): per second
// and since the nodes started, as RabbitMQ's queue page lists them.
const QUEUE_STATS = [
  ["publish", "incoming"], ["deliver", "deliver (manual ack)"],
  ["deliver_no_ack", "deliver (auto ack)"], ["get", "get (manual ack)"],
  ["get_no_ack", "get (auto ack)"], ["redeliver", "redelivered"], ["ack", "ack"]];

function messageRates(stats) {
  return table([""].concat(QUEUE_STATS.map(([, label]) => label)), [
    el("tr", {}, el("th", {}, "rate"), QUEUE_STATS.map(([key]) =>
      num(rate(stats[key + "_details"]), {id: "q-rate-" + key}))),
    el("tr", {}, el("th", {}, "count"), QUEUE_STATS.map(([key]) =>
      num(stats[key], {id: "q-count-" + key})))]);
}

// A quorum queue's Raft members as the node serving this page sees them
// (/api/queues/V/NAME/raft): its own replica's figures, and, when it leads, what it
// knows of each follower's log.
function raftTable(status) {
  const columns = ["term", "commit_index", "last_applied", "last_written", "snapshot_index",
                   "match_index", "next_index", "replication"];
  return el("div", {},
    table(["member", "raft state", "reachable"].concat(columns.map(c => c.replace(/_/g, " "))),
      status.members.map(m => el("tr", {"data-member": m.node},
        el("td", {}, m.node + (m.node === status.reporting_node ? " (this node)" : "")),
        el("td", {class: "raft-state"}, m.raft_state),
        el("td", {class: m.online ? "ok" : "bad"}, m.online ? "online" : "offline"),
        columns.map(c => num(m[c] === undefined ? "" : m[c]))))),
    el("p", {class: "muted"}, "Figures of a member on another node are its node's; " +
       "match and next index are known by the leader's node."));
}

function getForm(path) {
  const form = el("form", {id: "get-form"},
    el("label", {}, "Ack mode ", el("select", {name: "ackmode"},
      el("option", {value: "ack_requeue_true"}, "Nack, requeue"),
      el("option", {value: "reject_requeue_true"}, "Reject, requeue"),
      el("option", {value: "ack_requeue_false"}, "Ack (removes them)"))),
    " ",
    el("label", {}, "Messages ", el("input", {name: "count", value: "1", size: 4})),
    " ",
    el("button", {type: "submit", id: "get"}, "Get messages"));
  form.addEventListener("submit", async event => {
    event.preventDefault();
    const data = new FormData(form);
    try {
      const got = await api("POST", path + "/get", {
        count: Number(data.get("count")), ackmode: data.get("ackmode"),
        encoding: "auto", truncate: 50000});
      showError("");
      document.getElementById("got").replaceChildren(got.length
        ? el("div", {}, got.map((m, i) => el("div", {class: "message"},
            el("h3", {}, "Message " + (i + 1)),
            el("p", {}, "exchange '" + m.exchange + "', routing key '" + m.routing_key +
                    "', redelivered " + m.redelivered + ", " + m.message_count +
                    " left in the queue, " + m.payload_bytes + " bytes" +
                    (m.payload_encoding === "base64" ? " (not UTF-8: shown as base64)" : "")),
            el("pre", {class: "payload"}, m.payload))))
        : el("p", {class: "muted", id: "queue-empty"}, "Queue is empty."));
      refresh();
    } catch (error) {
      showError(error.message);
    }
  });
  return form;
}

async function purge(path) {
  if (!confirm("Purge every ready message of this queue?")) return;
  try {
    await api("DELETE", path + "/contents");
    showError("");
    refresh();
  } catch (error) {
    showError(error.message);
  }
}

async function remove(path, name) {
  if (!confirm("Delete queue " + name + "?")) return;
  try {
    await api("DELETE", path);
    showError("");
    location.hash = "#/queues";
  } catch (error) {
    showError(error.message);
  }
}

// ---------------------------------------------------------------- leases

// The Spark connector's durable leases (/api/leases, administrator tag): what each
// holds, how long it has been idle, when its timeout gives the messages back. Release
// gives them back now and fences the lease (docs/behaviour/leases.md).
function seconds(ms) {
  return ms === null || ms === undefined ? "" : (ms / 1000).toFixed(1) + " s";
}

async function leasesView() {
  let leases;
  try {
    leases = await get("/leases");
  } catch (error) {
    if (!error.message.startsWith("401")) throw error;
    show(el("h1", {}, "Leases"), el("p", {class: "muted"}, "Needs the administrator tag."));
    return;
  }
  show(el("h1", {}, "Leases"),
    el("p", {class: "muted"}, "Durable leases of quorum queues (the Spark connector's lease " +
       "mode). Release gives a lease's messages back to its queue and fences it: the query " +
       "that held it fails at its next start, naming them."),
    table(["vhost", "queue", "lease", "state", "messages", "sequences", "idle", "timeout in",
           "fenced", ""],
      leases.map(l => el("tr", {"data-lease": l.lease, "data-queue": l.queue},
        el("td", {}, l.vhost), el("td", {}, l.queue), el("td", {}, l.lease),
        el("td", {class: "lease-state"}, l.state),
        num(l.messages, {class: "num lease-messages"}),
        el("td", {}, l.messages ? l.first + ".." + l.end : ""),
        num(seconds(l.idle_ms)), num(seconds(l.expires_in_ms)),
        el("td", {}, l.fence ? l.fence.first + ".." + l.fence.end + " (" +
           (l.fence.reason === "timeout" ? "timed out" : "released") + ")" : ""),
        el("td", {}, l.state === "holding"
          ? el("button", {type: "button", class: "release-lease",
                          onclick: () => releaseLease(l)}, "Release")
          : "")))));
}

async function releaseLease(lease) {
  if (!confirm("Give the " + lease.messages + " messages of lease " + lease.lease +
               " back to queue " + lease.queue + "? The query holding it will fail at its " +
               "next start.")) return;
  try {
    await api("DELETE", "/leases/" + enc(lease.vhost) + "/" + enc(lease.queue) + "/" +
              enc(lease.lease));
    showError("");
    refresh();
  } catch (error) {
    showError(error.message);
  }
}

// ---------------------------------------------------------------- the other lists

async function exchangesView() {
  const exchanges = await get("/exchanges");
  show(el("h1", {}, "Exchanges"),
    table(["vhost", "name", "type", "durable", "auto delete", "internal", "policy"],
      exchanges.map(x => el("tr", {},
        el("td", {}, x.vhost), el("td", {}, x.name || "(AMQP default)"), el("td", {}, x.type),
        el("td", {}, String(x.durable)), el("td", {}, String(x.auto_delete)),
        el("td", {}, String(x.internal)), el("td", {}, x.policy || "")))));
}

async function connectionsView() {
  const connections = await get("/connections");
  show(el("h1", {}, "Connections"),
    table(["name", "user", "vhost", "state", "channels", "client"],
      connections.map(c => el("tr", {},
        el("td", {}, c.name), el("td", {}, c.user), el("td", {}, c.vhost),
        el("td", {}, c.state), num(c.channels),
        el("td", {}, ((c.client_properties || {}).product || "") + " " +
                     ((c.client_properties || {}).version || ""))))));
}

async function adminView() {
  const optional = path => get(path).catch(() => null);
  const [users, vhosts, policies, operator] = await Promise.all([
    optional("/users"), get("/vhosts"), get("/policies"), optional("/operator-policies")]);
  const adminOnly = el("p", {class: "muted"}, "Needs the administrator tag.");
  const policyTable = rows => table(["vhost", "name", "pattern", "apply to", "definition", "priority"],
    rows.map(p => el("tr", {}, el("td", {}, p.vhost), el("td", {}, p.name),
      el("td", {}, p.pattern), el("td", {}, p["apply-to"]),
      el("td", {}, JSON.stringify(p.definition)), num(p.priority))));
  show(el("h1", {}, "Users, virtual hosts, policies"),
    el("h2", {}, "Users"),
    users === null ? adminOnly : table(["name", "tags"], users.map(u => el("tr", {},
      el("td", {}, u.name), el("td", {}, [].concat(u.tags).join(", "))))),
    el("h2", {}, "Virtual hosts"),
    table(["name", "messages"], vhosts.map(v => el("tr", {},
      el("td", {}, v.name), num(v.messages)))),
    el("h2", {}, "Policies"), policyTable(policies),
    el("h2", {}, "Operator policies"), operator === null ? adminOnly : policyTable(operator));
}

// ---------------------------------------------------------------- routing

const VIEWS = {
  overview: overviewView, queues: queuesView, queue: queueView, leases: leasesView,
  exchanges: exchangesView, connections: connectionsView, admin: adminView,
};

async function refresh(first) {
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const view = VIEWS[parts[0]] || overviewView;
  try {
    if (view === overviewView || view === queueView || view === queuesView) {
      await view(first, ...parts.slice(1));
    }
    else await view(...parts.slice(1));
    if (!first) return;
    showError("");
  } catch (error) {
    if (error.message.startsWith("401")) {
      // credentials refused (changed password, deleted user): back to the login form
      sessionStorage.removeItem(AUTH_KEY);
      route();
    }
    showError(error.message);
  }
}

function route() {
  clearInterval(timer);
  chart = null;
  const who = document.getElementById("who");
  const logout = document.getElementById("logout");
  if (!credentials()) {
    who.textContent = "";
    logout.hidden = true;
    loginView();
    return;
  }
  who.textContent = decodeURIComponent(escape(atob(credentials()))).split(":")[0];
  logout.hidden = false;
  const name = location.hash.replace(/^#\/?/, "").split("/")[0] || "overview";
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", link.getAttribute("href") === "#/" + name ||
                          (name === "queue" && link.getAttribute("href") === "#/queues"));
  }
  refresh(true);
  timer = setInterval(() => refresh(false), REFRESH_MS);
}

document.getElementById("logout").addEventListener("click", () => {
  sessionStorage.removeItem(AUTH_KEY);
  route();
});
window.addEventListener("hashchange", route);
route();
