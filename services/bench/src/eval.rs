//! `zopu-bench eval`: how well onboarding and exploration answer, measured on the
//! hand-written evaluation set in `tests/eval` (issue 19). Every case runs
//! through the product's real path: a managed nats-server, the services in
//! this process, setup cloning the case's repository (its archive unpacked
//! and committed into a local git repository), the onboarding flow, and one
//! user message per question, which the conversation agent turns into an
//! exploration flow. Scores come from the flows' recorded results.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};
use zopu_answerer::explore::{FileRole, role_of};
use zopu_runtime::Shutdown;
use zopu_runtime::local_server::{LocalServer, SyncPolicy};
use zopu_runtime::log::{Reader, Start};
use zopu_runtime::nats::Bus;
use zopu_runtime::publish::Publisher;
use zopu_schema::flow_result::{ExplorationResult, OnboardingResult};
use zopu_schema::pb::{self, FlowType};
use zopu_schema::{CorrelationId, Envelope, EventId, OrgId, ProjectId, subjects};

use zopu_cli::Context;
use zopu_cli::commands::services::{Service, run_service};

mod cases;

use cases::{load_cases, unpack};

/// Services an evaluation needs (no gateway, no executor).
const EVAL_SERVICES: [Service; 5] = [
    Service::Setup,
    Service::Dispatch,
    Service::Conversation,
    Service::Specialists,
    Service::Artifacts,
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Half {
    /// The cases tuned against.
    Dev,
    /// The cases kept out of the tuning.
    Holdout,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
enum About {
    Behaviour,
    Tests,
    Docs,
}

/// One repository of the set (`tests/eval/cases/<name>.toml`; the format is
/// in `tests/eval/cases/FORMAT.md`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    repository: String,
    commit: String,
    language: String,
    half: Half,
    archive: PathBuf,
    #[serde(default)]
    excluded: Vec<String>,
    onboarding: Facts,
    questions: Vec<Question>,
}

/// The onboarding facts a maintainer would state.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Facts {
    project_name: String,
    languages: Vec<String>,
    #[serde(default)]
    frameworks: Vec<String>,
    #[serde(default)]
    entry_points: Vec<String>,
    #[serde(default)]
    build_commands: Vec<String>,
    #[serde(default)]
    test_commands: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Question {
    text: String,
    about: About,
    expected: Vec<String>,
    #[serde(default)]
    #[allow(dead_code)]
    note: String,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  zopu-bench eval\n  zopu-bench eval --half dev --details\n  zopu-bench eval --case zoxide --case chi --json"
)]
pub struct EvalArgs {
    /// The evaluation set: a directory with cases/*.toml and repos/*.tar.gz
    #[arg(long, default_value = "tests/eval")]
    set: PathBuf,
    /// Only this half of the set (default: both, each reported on its own)
    #[arg(long)]
    half: Option<Half>,
    /// Only these cases (by name; repeatable)
    #[arg(long = "case", value_name = "NAME")]
    cases: Vec<String>,
    /// How long one flow (onboarding or one question's exploration) may take, in seconds
    #[arg(long, default_value_t = 180)]
    timeout: u64,
    /// Also print every question's top three files and what was expected
    #[arg(long)]
    details: bool,
}

/// One question's outcome.
#[derive(Debug, Clone, Serialize)]
struct Answered {
    question: String,
    about: About,
    expected: Vec<String>,
    /// The exploration's files in rank order (empty: no exploration ran).
    ranked: Vec<String>,
    /// What happened instead of an exploration, if one did not complete.
    missing: Option<String>,
}

impl Answered {
    fn top1(&self) -> bool {
        self.ranked
            .first()
            .is_some_and(|path| self.expected.contains(path))
    }

    /// Share of the expected files (at most three) among the top three.
    fn recall3(&self) -> f64 {
        let wanted = self.expected.len().min(3);
        if wanted == 0 {
            return 0.0;
        }
        let found = self
            .ranked
            .iter()
            .take(3)
            .filter(|path| self.expected.contains(path))
            .count();
        found.min(wanted) as f64 / wanted as f64
    }

    /// Tests, docs and changelogs among the top three (behaviour questions).
    fn noise3(&self) -> (usize, usize) {
        let top: Vec<&String> = self.ranked.iter().take(3).collect();
        let noise = top
            .iter()
            .filter(|path| {
                matches!(
                    role_of(path),
                    FileRole::Tests | FileRole::Docs | FileRole::Changelog
                )
            })
            .count();
        (noise, top.len())
    }
}

/// One onboarding fact checked.
#[derive(Debug, Clone, Serialize)]
struct Fact {
    fact: String,
    expected: String,
    found: bool,
    /// What the onboarding reported for this kind of fact.
    reported: String,
}

/// One case's outcome.
#[derive(Debug, Clone, Serialize)]
struct CaseReport {
    name: String,
    half: Half,
    language: String,
    /// What the case's archive leaves out of the repository.
    excluded: Vec<String>,
    onboarding: Vec<Fact>,
    answers: Vec<Answered>,
    /// Why the case could not run to the end, if it could not.
    error: Option<String>,
}

/// Sums over cases.
#[derive(Debug, Default, Clone, Serialize)]
struct Score {
    cases: usize,
    questions: usize,
    top1: f64,
    recall3: f64,
    /// Tests/docs/changelogs among the top three of behaviour questions.
    noise3: f64,
    facts_found: usize,
    facts: usize,
}

fn score<'a>(reports: impl IntoIterator<Item = &'a CaseReport>) -> Score {
    let mut score = Score::default();
    let (mut top1, mut recall3, mut noise, mut slots) = (0usize, 0.0, 0usize, 0usize);
    for report in reports {
        score.cases += 1;
        score.facts += report.onboarding.len();
        score.facts_found += report.onboarding.iter().filter(|f| f.found).count();
        for answer in &report.answers {
            score.questions += 1;
            top1 += usize::from(answer.top1());
            recall3 += answer.recall3();
            if answer.about == About::Behaviour {
                let (n, of) = answer.noise3();
                noise += n;
                slots += of;
            }
        }
    }
    if score.questions > 0 {
        score.top1 = top1 as f64 / score.questions as f64;
        score.recall3 = recall3 / score.questions as f64;
    }
    if slots > 0 {
        score.noise3 = noise as f64 / slots as f64;
    }
    score
}

pub async fn run(context: &Context, args: EvalArgs) -> anyhow::Result<ExitCode> {
    let cases = load_cases(&args.set, args.half, &args.cases)?;
    ensure!(
        !cases.is_empty(),
        "no case of {} matches the filters",
        args.set.display()
    );
    let work = tempfile::Builder::new().prefix("zopu-eval-").tempdir()?;
    let repos = work.path().join("repos");
    std::fs::create_dir_all(&repos)?;
    let repos = std::fs::canonicalize(&repos)?;
    for case in &cases {
        unpack(&args.set, case, &repos)
            .with_context(|| format!("case {}: unpacking {}", case.name, case.archive.display()))?;
    }
    progress(
        context,
        &format!("zopu-bench eval: {} case(s)", cases.len()),
    );

    let mut server =
        LocalServer::start(&work.path().join("nats"), None, SyncPolicy::ServerDefault)?;
    let mut config = context.config.clone();
    config.nats_url = server.url();
    config.data_dir = work.path().join("data");
    config.sandbox.allow_local_repositories = true;
    config.sandbox.local_repository_roots = vec![repos.clone()];
    let config = config.resolved();
    config.validate()?;
    let core = config.core();
    let bus =
        zopu_runtime::nats::connect(&core.nats_url, "zopu-eval", Duration::from_secs(10)).await?;
    zopu_runtime::streams::apply(&bus, &zopu_runtime::streams::StreamSettings::from(&core)).await?;
    let shutdown = Shutdown::new();
    shutdown.cancel_on_signals();
    for service in EVAL_SERVICES {
        let (config, child, stopper) = (config.clone(), shutdown.child(), shutdown.clone());
        shutdown.spawn(async move {
            if let Err(error) = run_service(service, &config, None, None, child).await {
                tracing::error!(service = service.name(), error = %format!("{error:#}"), "service stopped; stopping the evaluation");
                stopper.cancel();
            }
        });
    }

    let timeout = Duration::from_secs(args.timeout);
    let runs = cases.iter().map(|case| {
        let (bus, repos) = (bus.clone(), repos.clone());
        async move {
            let mut report = CaseReport {
                name: case.name.clone(),
                half: case.half,
                language: case.language.clone(),
                excluded: case.excluded.clone(),
                onboarding: Vec::new(),
                answers: Vec::new(),
                error: None,
            };
            if let Err(error) =
                evaluate(&bus, case, &repos.join(&case.name), timeout, &mut report).await
            {
                report.error = Some(format!("{error:#}"));
            }
            if !context.json {
                let s = score([&report]);
                println!(
                    "  {:<14} done: top-1 {:.2}, recall@3 {:.2}, onboarding {}/{}{}",
                    report.name,
                    s.top1,
                    s.recall3,
                    s.facts_found,
                    s.facts,
                    report
                        .error
                        .as_deref()
                        .map(|e| format!(" (error: {e})"))
                        .unwrap_or_default()
                );
            }
            report
        }
    });
    let reports = tokio::select! {
        reports = futures::future::join_all(runs) => reports,
        () = shutdown.cancelled() => bail!("the services stopped before the evaluation ended (see the log above)"),
    };
    shutdown.cancel();
    shutdown.wait(config.shutdown_grace).await;
    // Every connection closed before its server stops: no reconnect noise.
    if let Err(error) = bus.client.drain().await {
        tracing::debug!(%error, "the evaluation's connection did not drain");
    }
    server.stop();
    print_reports(context, &args, &reports);
    Ok(if reports.iter().any(|r| r.error.is_some()) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn progress(context: &Context, line: &str) {
    if !context.json {
        println!("{line}");
    }
}

/// One case: its project set up and onboarded, then each question asked.
async fn evaluate(
    bus: &Bus,
    case: &Case,
    repository: &Path,
    timeout: Duration,
    report: &mut CaseReport,
) -> anyhow::Result<()> {
    let org: OrgId = "eval".parse()?;
    let project = ProjectId::new();
    let publisher = Publisher::new(bus.clone(), "cli", None);
    let request_id = EventId::new().to_string();
    let mut request = zopu_setup::client::SetupRequest::new(
        org.clone(),
        project,
        &repository.display().to_string(),
        "main",
        1,
        &request_id,
    )
    .allow_local_repositories(true);
    request.project_name = case.name.clone();
    zopu_setup::client::request_setup(&publisher, &request).await?;
    let onboarding = completed_flow(
        bus,
        &org,
        &project,
        None,
        FlowType::OnboardingExplore,
        0,
        timeout,
    )
    .await
    .context("onboarding")?;
    let onboarding = match onboarding {
        Ok(json) => zopu_schema::flow_result::decode::<OnboardingResult>(&json)
            .map_err(|error| anyhow::anyhow!("the onboarding result does not decode: {error}"))?,
        Err(missing) => bail!("onboarding did not complete: {missing}"),
    };
    report.onboarding = facts(&case.onboarding, &onboarding);
    for question in &case.questions {
        let correlation = CorrelationId::from(EventId::new());
        let sent = zopu_conversation::send_message(
            &publisher,
            &org,
            &project,
            &question.text,
            pb::Actor {
                kind: pb::actor::Kind::User as i32,
                id: "eval".into(),
            },
            correlation.as_str(),
        )
        .await?;
        let outcome = completed_flow(
            bus,
            &org,
            &project,
            Some(&correlation),
            FlowType::Explore,
            sent.sequence,
            timeout,
        )
        .await
        .with_context(|| format!("question {:?}", question.text))?;
        let (ranked, missing) = match outcome {
            Ok(json) => match zopu_schema::flow_result::decode::<ExplorationResult>(&json) {
                Ok(result) => (ranked_files(&result), None),
                Err(error) => (
                    Vec::new(),
                    Some(format!("the result does not decode: {error}")),
                ),
            },
            Err(missing) => (Vec::new(), Some(missing)),
        };
        report.answers.push(Answered {
            question: question.text.clone(),
            about: question.about,
            expected: question.expected.clone(),
            ranked,
            missing,
        });
    }
    Ok(())
}

/// The result JSON of the first completed `flow_type` flow of the project
/// stored after sequence `after` (0: from the start) and of the message
/// `correlation`, when given; `Err` says what happened instead (the flow
/// failed, or the turn ended without one).
async fn completed_flow(
    bus: &Bus,
    org: &OrgId,
    project: &ProjectId,
    correlation: Option<&CorrelationId>,
    flow_type: FlowType,
    after: u64,
    timeout: Duration,
) -> anyhow::Result<Result<String, String>> {
    let start = if after == 0 {
        Start::Beginning
    } else {
        Start::After(after)
    };
    let mut reader = Reader::open(bus, subjects::project_events(org, project), start).await?;
    // The message's own turn completes first; later dispatches of the same
    // correlation react to the flow's outcomes (an artifact published
    // before the flow's completion is "noted") and say nothing about
    // whether the agent explored.
    let mut turn_ended = false;
    let waiting = async {
        while let Some(logged) = reader.next().await {
            let Ok(event) = logged?.event else { continue };
            if correlation.is_some_and(|c| &event.correlation_id != c) {
                continue;
            }
            if let Some((ended, outcome)) = flow_end(&event) {
                if ended == flow_type {
                    return Ok(outcome);
                }
                // The message's turn ran another kind of flow: nothing else will come.
                if correlation.is_some() {
                    return Ok(Err(format!("the agent ran a {ended:?} flow instead")));
                }
            }
            if correlation.is_some()
                && !turn_ended
                && event.is::<pb::DispatchCompleted>()
                && let Ok(done) = event.decode::<pb::DispatchCompleted>()
            {
                if done.outcome != "flow_requested" {
                    return Ok(Err(format!("the agent did not explore ({})", done.outcome)));
                }
                turn_ended = true;
            }
            if correlation.is_some() && !turn_ended && event.is::<pb::DispatchFailed>() {
                return Ok(Err("the agent's turn failed".to_owned()));
            }
        }
        bail!("the event stream ended")
    };
    tokio::time::timeout(timeout, waiting)
        .await
        .with_context(|| format!("no outcome within {}s", timeout.as_secs()))?
}

/// The type of the flow whose end `event` records, and how it ended: its
/// result JSON, or why there is none (failed, cancelled).
fn flow_end(event: &Envelope) -> Option<(FlowType, Result<String, String>)> {
    if event.is::<pb::FlowCompleted>() {
        let done = event.decode::<pb::FlowCompleted>().ok()?;
        return Some((done.flow_type(), Ok(done.result_json)));
    }
    if event.is::<pb::FlowFailed>() {
        let failed = event.decode::<pb::FlowFailed>().ok()?;
        let reason = failed
            .reason
            .as_ref()
            .map(|r| r.code.clone())
            .unwrap_or_default();
        return Some((
            failed.flow_type(),
            Err(format!("the flow failed ({reason})")),
        ));
    }
    if event.is::<pb::FlowCancelled>() {
        let cancelled = event.decode::<pb::FlowCancelled>().ok()?;
        let reason = format!("the flow was cancelled ({})", cancelled.reason);
        return Some((cancelled.flow_type(), Err(reason)));
    }
    None
}

/// An exploration's files in rank order: where its findings' evidence is.
fn ranked_files(result: &ExplorationResult) -> Vec<String> {
    let mut seen = BTreeSet::new();
    result
        .findings
        .iter()
        .flat_map(|finding| &finding.evidence)
        .filter(|evidence| seen.insert(evidence.path.clone()))
        .map(|evidence| evidence.path.clone())
        .collect()
}

/// The words of a label, lower case.
fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// A command without the environment runner it is typed through
/// (`uv run pytest` is `pytest` run in the project's environment).
fn without_runner(command: &str) -> &str {
    [
        "uv run ",
        "poetry run ",
        "pdm run ",
        "pipenv run ",
        "hatch run ",
        "npx ",
        "pnpm exec ",
    ]
    .iter()
    .find_map(|runner| command.strip_prefix(runner))
    .unwrap_or(command)
}

/// Letters and digits only, lower case: how facts are compared.
fn normalized(text: &str) -> String {
    text.chars()
        .filter(|c| c.is_alphanumeric())
        .flat_map(char::to_lowercase)
        .collect()
}

/// The onboarding facts of `expected` checked against `result`.
fn facts(expected: &Facts, result: &OnboardingResult) -> Vec<Fact> {
    let languages: Vec<&str> = result
        .stack
        .iter()
        .map(|item| item.language.as_str())
        .collect();
    let frameworks: Vec<&str> = result
        .stack
        .iter()
        .flat_map(|item| &item.frameworks)
        .map(String::as_str)
        .collect();
    let entry_points: Vec<&str> = result
        .entry_points
        .iter()
        .map(|p| p.path.as_str())
        .collect();
    let commands = |purposes: &[&str]| -> Vec<&str> {
        result
            .commands
            .iter()
            .filter(|hint| purposes.contains(&hint.purpose.as_str()))
            .map(|hint| hint.command.as_str())
            .collect()
    };
    let facts_entry = |fact: &str, expected: &str, found: bool, reported: &[&str]| Fact {
        fact: fact.to_owned(),
        expected: expected.to_owned(),
        found,
        reported: reported.join(", "),
    };
    let fact = |fact: &str, expected: &str, reported: &[&str]| {
        let found = reported
            .iter()
            .any(|seen| normalized(seen) == normalized(expected));
        facts_entry(fact, expected, found, reported)
    };
    let mut out = vec![fact(
        "project name",
        &expected.project_name,
        &[result.name.as_str()],
    )];
    // A language is found when the stack names it, in its own label
    // (`TypeScript/JavaScript (Node.js)` names JavaScript/TypeScript). A
    // family written with a slash is named by any of its members: a Node
    // project without TypeScript is labelled `JavaScript (Node.js)`.
    out.extend(expected.languages.iter().map(|language| {
        let found = languages.iter().any(|label| {
            let label = words(label);
            language
                .split('/')
                .any(|member| words(member).iter().all(|word| label.contains(word)))
        });
        facts_entry("language", language, found, &languages)
    }));
    out.extend(
        expected
            .frameworks
            .iter()
            .map(|f| fact("framework", f, &frameworks)),
    );
    out.extend(
        expected
            .entry_points
            .iter()
            .map(|e| fact("entry point", e, &entry_points)),
    );
    // One fact each: any of the commands a maintainer would type.
    for (name, wanted, purposes) in [
        (
            "build command",
            &expected.build_commands,
            &["build", "install"][..],
        ),
        ("test command", &expected.test_commands, &["test"][..]),
    ] {
        if wanted.is_empty() {
            continue;
        }
        let reported = commands(purposes);
        let found = wanted.iter().any(|want| {
            reported
                .iter()
                .any(|seen| normalized(without_runner(seen)) == normalized(want))
        });
        out.push(Fact {
            fact: name.to_owned(),
            expected: wanted.join(" | "),
            found,
            reported: reported.join(", "),
        });
    }
    out
}

fn print_reports(context: &Context, args: &EvalArgs, reports: &[CaseReport]) {
    let halves = [Half::Dev, Half::Holdout];
    if context.json {
        for report in reports {
            println!("{}", serde_json::json!({"kind": "case", "case": report}));
        }
        for half in halves {
            let of_half: Vec<&CaseReport> = reports.iter().filter(|r| r.half == half).collect();
            if !of_half.is_empty() {
                println!(
                    "{}",
                    serde_json::json!({"kind": "half", "half": half, "score": score(of_half)})
                );
            }
        }
        println!(
            "{}",
            serde_json::json!({"kind": "all", "score": score(reports)})
        );
        return;
    }
    println!();
    println!(
        "{:<14} {:<8} {:<22} {:>9} {:>6} {:>9} {:>13}",
        "case", "half", "language", "questions", "top-1", "recall@3", "onboarding"
    );
    for report in reports {
        let s = score([report]);
        println!(
            "{:<14} {:<8} {:<22} {:>9} {:>6.2} {:>9.2} {:>13}",
            report.name,
            format!("{:?}", report.half).to_lowercase(),
            report.language,
            s.questions,
            s.top1,
            s.recall3,
            format!("{}/{}", s.facts_found, s.facts)
        );
        if let Some(error) = &report.error {
            println!("    error: {error}");
        }
        if args.details {
            if !report.excluded.is_empty() {
                println!(
                    "    (the archive leaves out {})",
                    report.excluded.join(", ")
                );
            }
            for fact in report.onboarding.iter().filter(|f| !f.found) {
                println!(
                    "    onboarding missed {}: {} (reported: {})",
                    fact.fact, fact.expected, fact.reported
                );
            }
            for answer in &report.answers {
                let mark = if answer.top1() { "hit " } else { "miss" };
                let top: Vec<&str> = answer.ranked.iter().take(3).map(String::as_str).collect();
                println!("    {mark} {}", answer.question);
                println!("         got  {}", top.join(", "));
                println!("         want {}", answer.expected.join(", "));
                if let Some(missing) = &answer.missing {
                    println!("         ({missing})");
                }
            }
        }
    }
    println!();
    let line = |label: &str, s: &Score| {
        println!(
            "{label:<8} {} case(s), {} question(s): top-1 {:.2}, recall@3 {:.2}, tests/docs/changelogs in the top three of behaviour questions {:.0}%, onboarding facts {}/{}",
            s.cases,
            s.questions,
            s.top1,
            s.recall3,
            s.noise3 * 100.0,
            s.facts_found,
            s.facts
        );
    };
    for half in halves {
        let of_half: Vec<&CaseReport> = reports.iter().filter(|r| r.half == half).collect();
        if !of_half.is_empty() {
            line(&format!("{half:?}").to_lowercase(), &score(of_half));
        }
    }
    line("all", &score(reports));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(expected: &[&str], ranked: &[&str]) -> Answered {
        Answered {
            question: "q".into(),
            about: About::Behaviour,
            expected: expected.iter().map(|s| (*s).to_owned()).collect(),
            ranked: ranked.iter().map(|s| (*s).to_owned()).collect(),
            missing: None,
        }
    }

    #[test]
    fn top1_recall_and_noise_are_scored_from_the_ranked_files() {
        let hit = answered(
            &["src/a.rs", "src/b.rs"],
            &["src/a.rs", "tests/a.rs", "CHANGELOG.md"],
        );
        assert!(hit.top1());
        assert!((hit.recall3() - 0.5).abs() < 1e-9);
        assert_eq!(hit.noise3(), (2, 3));
        let miss = answered(
            &["src/a.rs"],
            &["src/c.rs", "src/d.rs", "src/a.rs", "src/e.rs"],
        );
        assert!(!miss.top1());
        assert!((miss.recall3() - 1.0).abs() < 1e-9);
        let none = answered(&["src/a.rs"], &[]);
        assert!(!none.top1());
        assert_eq!(none.recall3(), 0.0);
        assert_eq!(none.noise3(), (0, 0));
    }

    #[test]
    fn the_shipped_set_parses_and_every_case_is_well_formed() {
        let set = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/eval");
        let cases = load_cases(&set, None, &[]).expect("the evaluation set loads");
        assert!(cases.len() >= 12, "{} cases", cases.len());
        let languages: BTreeSet<&str> = cases.iter().map(|c| c.language.as_str()).collect();
        assert!(languages.len() >= 5, "{languages:?}");
        for half in [Half::Dev, Half::Holdout] {
            assert!(
                cases.iter().filter(|c| c.half == half).count() >= 5,
                "{half:?}"
            );
        }
        for case in &cases {
            assert!(case.questions.len() >= 5, "{}", case.name);
            assert!(set.join(&case.archive).is_file(), "{}", case.name);
        }
    }

    #[test]
    fn a_language_family_is_named_by_any_of_its_members() {
        let expected = Facts {
            project_name: "Express".into(),
            languages: vec!["JavaScript/TypeScript".into(), "Java".into()],
            frameworks: vec![],
            entry_points: vec![],
            build_commands: vec![],
            test_commands: vec![],
        };
        let result = OnboardingResult {
            name: "Express".into(),
            stack: vec![zopu_schema::flow_result::StackItem {
                language: "JavaScript (Node.js)".into(),
                tool: "npm".into(),
                manifest: "package.json".into(),
                frameworks: vec![],
                packages: 1,
            }],
            ..Default::default()
        };
        let found: Vec<(String, bool)> = facts(&expected, &result)
            .into_iter()
            .map(|fact| (fact.expected, fact.found))
            .collect();
        assert_eq!(
            found,
            [
                ("Express".to_owned(), true),
                ("JavaScript/TypeScript".to_owned(), true),
                ("Java".to_owned(), false),
            ]
        );
    }

    #[test]
    fn commands_and_names_compare_without_punctuation_or_case() {
        assert_eq!(normalized("Go test ./..."), "gotest");
        assert_eq!(normalized("LMAX Disruptor"), normalized("lmax-disruptor"));
    }
}
