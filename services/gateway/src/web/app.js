// Zopu web timeline. Hand-written, no dependencies. Every piece of data is
// inserted with textContent (never as HTML).
"use strict";

(function () {
  const TOKEN_KEY = "zopu.token";
  const body = document.body;
  const app = document.getElementById("app");
  const STEPS = [
    ["creating_workspace", "Creating workspace"],
    ["cloning", "Cloning repository"],
    ["checking", "Checking repository"],
    ["ready", "Ready"],
  ];

  const token = () => sessionStorage.getItem(TOKEN_KEY);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "class") node.className = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  async function api(method, path, payload) {
    const headers = { Authorization: "Bearer " + token() };
    if (payload !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(path, { method, headers, body: payload === undefined ? undefined : JSON.stringify(payload) });
    if (response.status === 401) {
      signOut("Your token was not accepted. Paste a valid one.");
      throw new Error("unauthorized");
    }
    const data = await response.json().catch(() => ({}));
    if (!response.ok) {
      const error = new Error((data.error && data.error.message) || response.statusText);
      error.field = data.error && data.error.field;
      throw error;
    }
    return data;
  }

  function signOut(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    showSignin(message);
  }

  function showSignin(message) {
    app.replaceChildren();
    document.getElementById("signout").hidden = true;
    document.getElementById("signin").hidden = false;
    document.getElementById("token-error").textContent = message || "";
    document.getElementById("token").focus();
  }

  function start() {
    document.getElementById("signin-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const value = document.getElementById("token").value.trim();
      sessionStorage.setItem(TOKEN_KEY, value);
      document.getElementById("signin").hidden = true;
      route();
    });
    document.getElementById("signout").addEventListener("click", () => signOut(""));
    // A link opened in a tab already on this page changes only the fragment.
    window.addEventListener("hashchange", () => {
      const link = signInTicket();
      if (link) signInWithLink(link);
    });
    const link = signInTicket();
    if (link) signInWithLink(link);
    else route();
  }

  function signInTicket() {
    const link = /^#signin=(zpk_[0-9a-f]+)$/.exec(location.hash);
    return link ? link[1] : null;
  }

  // A sign-in link (`zopu dev` prints one): its single-use ticket, in the
  // fragment so no server or log sees it, is exchanged once for a session
  // token; the address bar loses it at once.
  async function signInWithLink(ticket) {
    history.replaceState(null, "", location.pathname + location.search);
    try {
      const response = await fetch("/v1/session", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ ticket }) });
      const data = await response.json().catch(() => ({}));
      if (!response.ok) return signOut((data.error && data.error.message) || "This sign-in link did not work.");
      sessionStorage.setItem(TOKEN_KEY, data.token);
      document.getElementById("signin").hidden = true;
      route();
    } catch (_) {
      signOut("The sign-in link could not be checked. Try again, or paste a token.");
    }
  }

  function route() {
    if (!token()) return showSignin("");
    document.getElementById("signout").hidden = false;
    if (body.dataset.view === "project" && body.dataset.project) projectView(body.dataset.project);
    else projectsView();
  }

  // ------------------------------------------------------------ projects

  function stateLabel(state) {
    const step = STEPS.find(([key]) => key === state);
    return step ? step[1] : state === "failed" ? "Setup failed" : state;
  }

  async function projectsView() {
    const list = el("ul", { class: "projects", "aria-label": "Projects" });
    const error = el("p", { class: "error", role: "alert" });
    const form = el("form", { class: "panel", "aria-labelledby": "create-title" },
      el("h2", { id: "create-title" }, "Connect a repository"),
      el("label", { for: "repository" }, "Repository URL or local path"),
      el("input", { id: "repository", name: "repository", required: true, placeholder: "https://github.com/org/repo.git", autocomplete: "off" }),
      el("div", { class: "row" },
        el("div", {}, el("label", { for: "branch" }, "Branch"), el("input", { id: "branch", name: "branch", value: "main", autocomplete: "off" })),
        el("div", {}, el("label", { for: "name" }, "Name (optional)"), el("input", { id: "name", name: "name", autocomplete: "off" }))),
      error,
      el("button", { type: "submit" }, "Create project"));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      error.textContent = "";
      const data = new FormData(form);
      const payload = { repository: data.get("repository").trim(), branch: data.get("branch").trim() || "main" };
      if (data.get("name").trim()) payload.name = data.get("name").trim();
      try {
        const created = await api("POST", "/v1/projects", payload);
        location.assign("/p/" + created.project_id);
      } catch (failure) {
        error.textContent = failure.message;
        const field = failure.field && form.querySelector("#" + CSS.escape(failure.field));
        if (field) field.focus();
      }
    });
    app.replaceChildren(el("h1", {}, "Projects"), list, form);
    try {
      const { projects } = await api("GET", "/v1/projects");
      if (!projects.length) list.append(el("li", { class: "muted" }, "No projects yet."));
      for (const project of projects) {
        list.append(el("li", {},
          el("a", { href: "/p/" + project.project_id }, project.name),
          el("span", { class: "badge state-" + project.setup.state }, stateLabel(project.setup.state)),
          el("span", { class: "muted small" }, project.repository + " · " + project.branch)));
      }
    } catch (failure) {
      if (failure.message !== "unauthorized") error.textContent = failure.message;
    }
  }

  // ------------------------------------------------------------ one project

  async function projectView(id) {
    let project;
    try {
      project = await api("GET", "/v1/projects/" + id);
    } catch (failure) {
      if (failure.message !== "unauthorized") app.replaceChildren(el("h1", {}, "Project not found"), el("p", {}, el("a", { href: "/" }, "Back to projects")));
      return;
    }
    document.title = project.name + " · Zopu";
    const view = new ProjectScreen(project);
    await view.load();
    await view.listen();
  }

  class ProjectScreen {
    constructor(project) {
      this.project = project;
      this.seen = new Set();
      this.after = 0;
      this.pending = new Map();
      this.flows = new Map();
      this.works = new Map();
      // Approval cards by approval id, and the decisions already seen.
      this.approvals = new Map();
      // Artifact cards by artifact id (a published issue links from its card).
      this.artifactCards = new Map();
      this.decided = new Map();
      this.heading = el("h1", { tabindex: "-1" }, project.name);
      this.setup = el("section", { class: "panel setup", "aria-labelledby": "setup-title" });
      this.timeline = el("ol", { class: "timeline", role: "log", "aria-label": "Timeline", "aria-live": "polite" });
      // Cancel stops the running flows (their model call is aborted, their tool killed).
      this.cancelButton = el("button", { type: "button", class: "secondary small cancel", hidden: true, onclick: () => this.cancelFlows() }, "Cancel");
      this.cancelError = el("span", { class: "error", role: "alert" });
      this.running = el("p", { class: "running", role: "status", hidden: true }, el("span", { class: "dots", "aria-hidden": "true" }), "The agent is working", this.cancelButton, this.cancelError);
      this.agentButton = el("button", { type: "button", class: "secondary", onclick: () => this.toggleAgent() });
      this.composer = this.buildComposer();
      this.main = el("section", { class: "timeline-view", hidden: true, "aria-label": "Global timeline" }, this.timeline, this.running, this.composer);
      // What the agent remembers (the preferences the user stated): shown
      // when opened, each entry forgettable, all of it clearable.
      this.memoryList = el("ul", { class: "memory-list" });
      this.memoryError = el("p", { class: "error", role: "alert" });
      this.memory = el("details", { class: "panel memory", ontoggle: () => { if (this.memory.open) this.loadMemory(); } },
        el("summary", {}, "What the agent remembers"), this.memoryList, this.memoryError);
      // The project as it was: a slider over its history's sequences.
      this.pastView = el("div", { class: "past" });
      this.past = el("details", { class: "panel history", ontoggle: () => { if (this.past.open) this.loadPast(); } },
        el("summary", {}, "History: the project as it was"), this.pastView);
      // Events stored on the project's subjects that do not extend its
      // history chain: applied by no view, acted on by no agent.
      const refused = project.refused_events || [];
      this.refused = el("section", { class: "panel refused", role: "alert", hidden: !refused.length, "aria-labelledby": "refused-title" },
        el("h2", { id: "refused-title" }, "Refused events"),
        el("p", { class: "muted small" }, "Stored on this project without extending its history chain (written around Zopu's checks): not shown on the timeline, and the agent did not act on them."),
        el("ul", {}, refused.map((event) => el("li", {}, `#${event.sequence} ${event.event_type}: ${event.reason}`))));
      app.replaceChildren(
        el("div", { class: "title-row" }, this.heading, this.agentButton),
        el("p", { class: "muted small" }, project.repository + " · " + project.branch),
        this.refused, this.setup, this.memory, this.past, this.main);
      this.renderAgent();
      this.renderSetup(project.setup);
      this.setRunning(project.running);
    }

    async load() {
      for (;;) {
        const page = await api("GET", `/v1/projects/${this.project.project_id}/timeline?after=${this.after}`);
        page.items.forEach((item) => this.add(item));
        this.after = page.next_after;
        this.setRunning(page.running);
        if (!page.more) break;
      }
    }

    // The live stream. EventSource cannot send the bearer header and a token
    // in a URL is recorded by proxies and history, so each connection opens
    // with a single-use ticket asked for with the header. A ticket serves one
    // connection: when it drops, ask for a new one (resuming after the last
    // item seen) instead of letting the browser retry with a spent ticket.
    async listen() {
      if (this.source) this.source.close();
      this.source = null;
      let ticket;
      try {
        ticket = await api("POST", `/v1/projects/${this.project.project_id}/events/ticket`);
      } catch (failure) {
        if (failure.message !== "unauthorized") this.listenLater();
        return;
      }
      const source = new EventSource(`${ticket.url}&after=${this.after}`);
      this.source = source;
      source.onopen = () => { this.backoff = 0; };
      source.onmessage = (message) => {
        try { this.add(JSON.parse(message.data)); } catch (_) { /* ignore a malformed frame */ }
      };
      source.onerror = () => {
        source.close();
        if (this.source === source) this.listenLater();
      };
    }

    listenLater() {
      this.backoff = Math.min(30000, (this.backoff || 500) * 2);
      clearTimeout(this.reconnect);
      this.reconnect = setTimeout(() => this.listen(), this.backoff);
    }

    async loadMemory() {
      const base = `/v1/projects/${this.project.project_id}/memory`;
      this.memoryError.textContent = "";
      let listed;
      try { listed = await api("GET", base); } catch (failure) { this.memoryError.textContent = failure.message; return; }
      if (!listed.entries.length) {
        this.memoryList.replaceChildren(el("li", { class: "muted" }, "Nothing yet. Tell the agent a lasting preference, such as “From now on, answer in German”."));
        return;
      }
      const act = async (method, path) => {
        try { await api(method, path); } catch (failure) { this.memoryError.textContent = failure.message; }
        await this.loadMemory();
      };
      const items = listed.entries.map((entry) => el("li", {},
        el("span", { class: "memory-value" }, entry.value),
        el("span", { class: "muted small" }, ` ${entry.key} · ${entry.set_by.startsWith("agent:") ? "from the conversation" : entry.set_by}` +
          (entry.expires_at_unix_ms ? " · until " + new Date(entry.expires_at_unix_ms).toLocaleString() : "")),
        el("button", { type: "button", class: "secondary small", "aria-label": "Forget " + entry.key,
          onclick: () => act("DELETE", `${base}/${encodeURIComponent(entry.key)}`) }, "Forget")));
      items.push(el("li", {}, el("button", { type: "button", class: "secondary small", onclick: () => act("DELETE", base) }, "Clear all")));
      this.memoryList.replaceChildren(...items);
    }

    // The history slider: the project's first to last sequence; moving it
    // rebuilds the state as of that point (GET /v1/projects/{id}/history).
    async loadPast(at) {
      const error = el("p", { class: "error", role: "alert" });
      let past;
      try {
        past = await api("GET", `/v1/projects/${this.project.project_id}/history?at=${at === undefined ? this.after || 1 : at}`);
      } catch (failure) {
        this.pastView.replaceChildren(error);
        error.textContent = failure.message;
        return;
      }
      if (!this.slider) {
        this.slider = el("input", { type: "range", id: "history-at", step: "1" });
        this.slider.addEventListener("input", () => {
          clearTimeout(this.sliding);
          this.sliding = setTimeout(() => this.loadPast(this.slider.value), 250);
        });
        this.pastState = el("div", { class: "past-state", "aria-live": "polite" });
        this.pastView.replaceChildren(el("label", { for: "history-at" }, "Event"), this.slider, this.pastState);
      }
      this.slider.min = past.first_sequence;
      this.slider.max = past.last_sequence;
      if (at === undefined) this.slider.value = past.at_sequence;
      const items = past.timeline.filter((item) => item.text || item.artifact || item.work);
      this.pastState.replaceChildren(...[
        el("p", { class: "small" }, `As of #${past.at_sequence}: ${past.last_event_type} at ${new Date(past.last_event_time).toLocaleString()}`),
        el("p", { class: "small" }, `Setup: ${stateLabel(past.project.setup.state)} · agent ${past.project.agent_enabled ? "enabled" : "paused"} · ${past.works.length} work(s) · ${past.memory.length} remembered`),
        el("ol", { class: "past-timeline" }, items.slice(-50).map((item) => el("li", { class: "small" },
          el("code", {}, "#" + item.sequence), " ", el("strong", {}, item.kind.replace(/_/g, " ")), " ",
          (item.text || (item.artifact && item.artifact.title) || (item.work && item.work.title) || "").slice(0, 160)))),
        items.length ? null : el("p", { class: "muted small" }, "Nothing on the timeline yet."),
      ].filter(Boolean));
    }

    renderAgent() {
      this.agentButton.textContent = this.project.agent_enabled ? "Pause agent" : "Resume agent";
      this.agentButton.setAttribute("aria-pressed", this.project.agent_enabled ? "false" : "true");
    }

    async toggleAgent() {
      const action = this.project.agent_enabled ? "disable" : "enable";
      this.agentButton.disabled = true;
      try {
        await api("POST", `/v1/projects/${this.project.project_id}/agent/${action}`, {});
        this.project.agent_enabled = action === "enable";
        this.renderAgent();
      } finally {
        this.agentButton.disabled = false;
      }
    }

    renderSetup(setup) {
      this.project.setup = setup;
      const ready = setup.state === "ready";
      this.setup.hidden = ready;
      this.main.hidden = !ready;
      if (ready) return;
      const current = STEPS.findIndex(([key]) => key === setup.state);
      const failedAt = setup.state === "failed" ? Math.max(0, STEPS.findIndex(([key]) => key === stepState(setup.failed_step))) : -1;
      const steps = el("ol", { class: "steps" }, STEPS.map(([key, label], index) => {
        let status = "pending";
        if (failedAt >= 0) status = index < failedAt ? "done" : index === failedAt ? "failed" : "pending";
        else if (index < current) status = "done";
        else if (index === current) status = "current";
        return el("li", { class: "step " + status, "aria-current": status === "current" ? "step" : null },
          el("span", { class: "marker", "aria-hidden": "true" }), label,
          el("span", { class: "visually-hidden" }, " (" + status + ")"));
      }));
      const parts = [el("h2", { id: "setup-title" }, "Setting up"), steps];
      if (setup.failure) {
        const retry = el("button", { type: "button" }, "Retry setup");
        retry.addEventListener("click", async () => {
          retry.disabled = true;
          try { await api("POST", `/v1/projects/${this.project.project_id}/setup/retry`); }
          catch (failure) { retry.disabled = false; retry.after(el("p", { class: "error", role: "alert" }, failure.message)); }
        });
        parts.push(el("div", { class: "failure", role: "alert" }, el("p", {}, setup.failure.message), retry));
      }
      if (setup.environment_names && setup.environment_names.length) {
        parts.push(el("h3", {}, "Optional configuration"),
          el("p", { class: "muted small" }, "Detected in .env.example. Nothing is required to continue."),
          el("ul", { class: "env" }, setup.environment_names.map((name) => {
            // Which names hold a value (stored in the secret store; never shown).
            const stored = (setup.environment_values || []).find((value) => value.name === name);
            return el("li", {}, el("code", {}, name), stored ? el("span", { class: "muted small" }, " — set (version " + stored.version + ")") : el("span", { class: "muted small" }, " — not set"));
          })));
      }
      this.setup.replaceChildren(...parts);
    }

    buildComposer() {
      const input = el("textarea", { id: "message", name: "message", rows: "2", required: true, maxlength: "8000", "aria-describedby": "message-hint" });
      const error = el("p", { class: "error", role: "alert" });
      const form = el("form", { class: "composer" },
        el("label", { for: "message" }, "Message"),
        input,
        el("p", { id: "message-hint", class: "muted small" }, "Enter to send, Shift+Enter for a new line."),
        error,
        el("button", { type: "submit" }, "Send"));
      input.addEventListener("keydown", (event) => {
        if (event.key === "Enter" && !event.shiftKey && !event.isComposing) { event.preventDefault(); form.requestSubmit(); }
      });
      form.addEventListener("submit", async (event) => {
        event.preventDefault();
        const text = input.value.trim();
        if (!text) return;
        error.textContent = "";
        input.value = "";
        const optimistic = this.bubble("user_message", "You", text);
        optimistic.classList.add("pending");
        this.timeline.append(optimistic);
        optimistic.scrollIntoView({ block: "end" });
        try {
          const accepted = await api("POST", `/v1/projects/${this.project.project_id}/messages`, { text });
          if (this.seen.has(accepted.sequence)) optimistic.remove();
          else { optimistic.dataset.sequence = accepted.sequence; this.pending.set(accepted.sequence, optimistic); }
        } catch (failure) {
          optimistic.classList.add("failed");
          error.textContent = "Not sent: " + failure.message;
          input.value = text;
        }
      });
      return form;
    }

    setRunning(running) {
      this.running.hidden = !running;
      const cancellable = this.runningFlows().length > 0;
      this.cancelButton.hidden = !cancellable;
      if (!cancellable) { this.cancelButton.disabled = false; this.cancelButton.textContent = "Cancel"; }
    }

    runningFlows() {
      return [...this.flows].filter(([, state]) => state === "requested" || state === "running" || state === "progress").map(([id]) => id);
    }

    async cancelFlows() {
      this.cancelButton.disabled = true;
      this.cancelError.textContent = "";
      try {
        for (const flow of this.runningFlows()) {
          await api("POST", `/v1/projects/${this.project.project_id}/flows/${encodeURIComponent(flow)}/cancel`, {});
        }
        this.cancelButton.textContent = "Cancelling…";
      } catch (failure) {
        this.cancelError.textContent = "Not cancelled: " + failure.message;
        this.cancelButton.disabled = false;
      }
    }

    bubble(kind, who, text) {
      return el("li", { class: "item " + kind }, el("p", { class: "who" }, who), el("p", { class: "text" }, text));
    }

    add(item) {
      if (this.seen.has(item.sequence)) return;
      this.seen.add(item.sequence);
      this.after = Math.max(this.after, item.sequence);
      if (item.kind === "setup") {
        if (item.setup) this.renderSetup(item.setup);
        return;
      }
      if (item.kind === "flow") {
        this.flows.set(item.flow.flow_run_id, item.flow.state);
        this.setRunning(this.runningFlows().length > 0);
        if (item.flow.state !== "progress" && item.flow.state !== "failed") return;
      }
      if (item.kind === "work_updated") {
        const card = this.works.get(item.work.work_id);
        if (card) card.querySelector(".status").textContent = item.work.status_text;
        return;
      }
      const node = this.render(item);
      if (!node) return;
      node.dataset.sequence = item.sequence;
      if (item.event_id) node.append(this.whyPanel(item.event_id));
      const optimistic = this.pending.get(item.sequence);
      if (optimistic) { optimistic.replaceWith(node); this.pending.delete(item.sequence); return; }
      this.timeline.append(node);
      if (item.kind === "agent_final" || item.kind === "artifact") node.scrollIntoView({ block: "nearest" });
    }

    // Why this item happened: its causes back to the user action or
    // trigger, what it led to, and its correlation as a waterfall; fetched
    // when opened (GET /v1/projects/{id}/events/{event_id}/why).
    whyPanel(eventId) {
      const content = el("div", { class: "why-content" });
      const panel = el("details", { class: "why" }, el("summary", { class: "small" }, "Why?"), content);
      panel.addEventListener("toggle", async () => {
        if (!panel.open || panel.dataset.loaded) return;
        content.replaceChildren(el("p", { class: "muted small" }, "Reading the history…"));
        try {
          const why = await api("GET", `/v1/projects/${this.project.project_id}/events/${encodeURIComponent(eventId)}/why`);
          panel.dataset.loaded = "1";
          content.replaceChildren(...whyView(why));
          content.scrollIntoView({ block: "nearest" });
        } catch (failure) {
          content.replaceChildren(el("p", { class: "error" }, failure.message));
        }
      });
      return panel;
    }

    render(item) {
      switch (item.kind) {
        case "user_message": return this.bubble("user_message", item.author || "You", item.text);
        case "user_action": return el("li", { class: "item note" }, "Action ", el("code", {}, item.action.action_id), " sent");
        case "acknowledgement": return this.bubble("ack", "Agent", item.text);
        case "agent_message": return this.bubble("agent", "Agent", item.text);
        case "agent_blocked": return this.bubble("agent blocked", "Agent needs an answer", item.text);
        case "agent_final": {
          const node = this.bubble("agent final", "Agent", item.text);
          if (item.failure) node.append(el("p", { class: "error" }, item.failure.message));
          return node;
        }
        case "agent_state": return el("li", { class: "item note" }, item.status === "disabled" ? "Agent paused" : "Agent resumed", item.text ? " — " + item.text : "");
        case "work": {
          const card = el("li", { class: "item card work" },
            el("p", { class: "kicker" }, "Work · " + item.work.kind),
            el("h3", {}, item.work.title),
            item.work.summary ? el("p", {}, item.work.summary) : null,
            el("p", { class: "small" }, "Status: ", el("span", { class: "status" }, item.work.status_text)));
          this.works.set(item.work.work_id, card);
          return card;
        }
        case "flow": return el("li", { class: "item note" + (item.flow.state === "failed" ? " error" : "") },
          item.flow.state === "failed" ? "A step failed: " + ((item.failure && item.failure.message) || "") : item.flow.note);
        case "artifact": return this.artifactCard(item.artifact);
        case "approval": return this.approvalCard(item);
        case "approval_decision": {
          this.decide(item.approval.approval_id, item.status, item.author);
          const outcome = { approved: "Approved", rejected: "Rejected", expired: "Expired: nobody decided in time" }[item.status] || item.status;
          const who = item.author ? " by " + item.author : "";
          const why = item.text ? " — " + item.text : "";
          return el("li", { class: "item note approval-decision" }, outcome + who + why);
        }
        case "execution": return this.execution(item);
        default: return null;
      }
    }

    // What the agent asks to do outside the runtime, with Approve / Reject
    // (the gateway refuses them without the approve scope, or once decided).
    approvalCard(item) {
      const approval = item.approval;
      const status = el("span", { class: "status" }, "pending");
      const error = el("p", { class: "error", role: "alert" });
      const decide = (verb, payload) => {
        const button = el("button", { type: "button", class: verb === "approve" ? "" : "secondary" }, verb === "approve" ? "Approve" : "Reject");
        button.addEventListener("click", async () => {
          for (const other of buttons.querySelectorAll("button")) other.disabled = true;
          error.textContent = "";
          try { await api("POST", `/v1/projects/${this.project.project_id}/approvals/${encodeURIComponent(approval.approval_id)}/${verb}`, payload); }
          catch (failure) {
            error.textContent = failure.message;
            for (const other of buttons.querySelectorAll("button")) other.disabled = false;
          }
        });
        return button;
      };
      const buttons = el("div", { class: "actions" }, decide("approve", {}), decide("reject", {}));
      const card = el("li", { class: "item card approval" },
        el("p", { class: "kicker" }, "Approval needed · " + approval.action),
        el("p", {}, item.text),
        approval.expires_at ? el("p", { class: "small" }, "Open until " + new Date(approval.expires_at).toLocaleString()) : null,
        el("p", { class: "small" }, "Status: ", status),
        buttons, error);
      this.approvals.set(approval.approval_id, card);
      const earlier = this.decided.get(approval.approval_id);
      if (earlier) this.decide(approval.approval_id, earlier.status, earlier.author);
      return card;
    }

    decide(approvalId, status, author) {
      this.decided.set(approvalId, { status, author });
      const card = this.approvals.get(approvalId);
      if (!card) return;
      card.querySelector(".status").textContent = status + (author ? " by " + author : "");
      const buttons = card.querySelector(".actions");
      if (buttons) buttons.remove();
    }

    // How an approved action was carried out: shown under its approval and,
    // for a published issue, as a link on the artifact card.
    execution(item) {
      const link = (url) => /^https?:\/\//.test(url)
        ? el("a", { href: url, target: "_blank", rel: "noopener noreferrer", class: "tracker-link" }, url)
        : el("span", {}, url);
      const line = () => {
        switch (item.status) {
          case "created": return el("p", { class: "small execution" }, "Published: ", link(item.text));
          case "dry_run": return el("p", { class: "small execution" }, "Dry run (nothing sent): " + item.text);
          default: return el("p", { class: "small execution error" }, "Not carried out: " + item.text);
        }
      };
      const card = this.approvals.get(item.approval.approval_id);
      if (card) card.append(line());
      if (item.status === "created") {
        for (const id of item.artifact_ids || []) {
          const artifact = this.artifactCards.get(id);
          if (!artifact) continue;
          artifact.append(line());
          // Published: the card says so and offers no second publish.
          for (const term of artifact.querySelectorAll(".facts dt")) {
            if (term.textContent === "Status" && term.nextElementSibling) term.nextElementSibling.textContent = "published";
          }
          artifact.querySelectorAll('button[data-action="publish"]').forEach((button) => button.remove());
        }
      }
      return el("li", { class: "item note execution" + (item.status === "failed" ? " error" : "") }, line());
    }

    artifactCard(artifact) {
      // A plain link with rel="noopener noreferrer": the artifact's tab gets
      // no handle on this window and no copy of its sessionStorage (the
      // token). Its href is a short-lived signed link, fetched when the
      // pointer or focus comes near and again once it is about to expire.
      const open = el("a", { class: "button open", href: "#", target: "_blank", rel: "noopener noreferrer" }, "Open " + (artifact.label || artifact.title));
      let link = null;
      const fresh = () => link !== null && link.expires_at * 1000 - Date.now() > 20000;
      const prepare = async () => {
        if (fresh()) return;
        try {
          link = await api("GET", `/v1/artifacts/${artifact.artifact_id}/link?revision=${artifact.revision}`);
          open.href = link.url;
        } catch (_) { link = null; }
      };
      open.addEventListener("pointerenter", prepare);
      open.addEventListener("focus", prepare);
      open.addEventListener("click", async (event) => {
        if (fresh()) return; // the browser follows the link itself
        event.preventDefault();
        await prepare();
        if (fresh()) window.open(link.url, "_blank", "noopener,noreferrer");
      });
      const facts = el("dl", { class: "facts" }, artifact.facts.map((fact) => [el("dt", {}, fact.label), el("dd", {}, fact.value)]));
      const actions = artifact.actions.map((action) => {
        const button = el("button", { type: "button", class: action.style === "primary" ? "" : "secondary", "data-action": action.id }, action.label);
        button.addEventListener("click", async () => {
          button.disabled = true;
          try { await api("POST", `/v1/projects/${this.project.project_id}/actions`, { artifact_id: artifact.artifact_id, action_id: action.id }); }
          catch (failure) { button.disabled = false; }
        });
        return button;
      });
      const card = el("li", { class: "item card artifact" },
        el("p", { class: "kicker" }, "Artifact · revision " + artifact.revision),
        el("h3", {}, artifact.title),
        artifact.summary ? el("p", {}, artifact.summary) : null,
        facts,
        el("div", { class: "actions" }, open, actions));
      this.artifactCards.set(artifact.artifact_id, card);
      return card;
    }
  }

  function stepLine(step, indent) {
    const line = el("li", { class: "why-step" },
      el("code", {}, "#" + step.sequence), " ", el("strong", {}, step.event_type),
      el("span", { class: "muted small" }, ` ${step.source} · +${step.after_cause_ms} ms after its cause`));
    if (indent) line.style.marginLeft = (indent * 1.2) + "em";
    return line;
  }

  function whyView(why) {
    const causes = why.causes.length
      ? el("ol", { class: "why-list" }, why.causes.map((step) => stepLine(step, 0)))
      : el("p", { class: "small" }, "Nothing in the log: a user action or an external trigger.");
    const missing = why.missing_cause ? el("p", { class: "small error" }, "Its chain stops at " + why.missing_cause + ", which is not in this project's history.") : null;
    const consequences = why.consequences.length
      ? el("ol", { class: "why-list" }, why.consequences.map((step) => stepLine(step, step.depth - 1)))
      : el("p", { class: "small muted" }, "Nothing yet.");
    const span = Math.max(1, ...why.correlation.map((step) => step.offset_ms));
    const waterfall = el("ol", { class: "waterfall", "aria-label": "The correlation's events over time" }, why.correlation.map((step) => {
      const bar = el("span", { class: "tick" + (step.id === why.event.id ? " this" : "") });
      bar.style.marginLeft = (100 * step.offset_ms / span).toFixed(1) + "%";
      const row = el("li", {}, el("span", { class: "label small" }, `+${step.offset_ms} ms ${step.event_type} (${step.source})`), el("span", { class: "track" }, bar));
      row.style.paddingLeft = (step.depth * 0.6) + "em";
      return row;
    }));
    return [
      el("h4", {}, "Caused by"), causes, ...(missing ? [missing] : []),
      el("h4", {}, "Led to"), consequences,
      el("h4", {}, "Its correlation"), waterfall,
    ];
  }

  function stepState(step) {
    switch (step) {
      case "workspace": return "creating_workspace";
      case "clone": return "cloning";
      case "verify": case "register": case "scan": return "checking";
      default: return "creating_workspace";
    }
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
