//! What `zopu-bench soak` reports: the minutes, the invariants, flatness
//! and the baseline, gathered from the run and printed.

use super::fleet::Usage;
use super::viewers::{REVOCATION_BUDGET, Viewers};
use super::{NATS_SERVER, Sample, SoakArgs, Turn, Turns};
use crate::bench::ack::percentile;

/// One reported minute.
#[derive(Debug, serde::Serialize)]
pub(super) struct Minute {
    pub(super) minute: usize,
    pub(super) sent: usize,
    /// Turns whose message was sent in this minute and that ended.
    pub(super) ended: usize,
    pub(super) ack_p50_ms: Option<f64>,
    pub(super) ack_p99_ms: Option<f64>,
    /// Sampled at the minute's end, before that moment's restart.
    pub(super) usage: Vec<Usage>,
    pub(super) total_rss_mb: f64,
    pub(super) streams_open: u64,
    /// Services restarted during the minute.
    pub(super) restarted: Vec<String>,
}

#[derive(Debug, serde::Serialize)]
pub(super) struct Invariants {
    pub(super) messages_sent: usize,
    pub(super) messages_stored: usize,
    pub(super) messages_stored_twice: usize,
    /// Messages the agent replied to (acknowledged, or answered at once).
    pub(super) replied: usize,
    pub(super) acknowledged_twice: usize,
    pub(super) turns_ended: usize,
    pub(super) turns_ended_twice: usize,
    pub(super) turns_not_ended: usize,
    pub(super) revocations: usize,
    pub(super) revocation_close_max_ms: f64,
    pub(super) streams_left_open: usize,
    pub(super) services_died: Vec<(String, usize)>,
    pub(super) audit_clean: bool,
    pub(super) audit_findings: usize,
    pub(super) events_audited: u64,
    pub(super) holds: bool,
}

/// Raw JetStream appends in the contract's shape (headers, the per-project
/// expectation, sequential per project) at the soak's write rate.
#[derive(Debug, serde::Serialize)]
pub(super) struct Baseline {
    /// Events the soak stored per second.
    pub(super) write_rate_per_s: f64,
    pub(super) raw_append_p50_ms: f64,
    pub(super) raw_append_p99_ms: f64,
}

#[derive(Debug, serde::Serialize)]
pub(super) struct Flatness {
    /// The minutes compared (1-based, inclusive).
    pub(super) early: (usize, usize),
    pub(super) late: (usize, usize),
    pub(super) ack_p99_early_ms: f64,
    pub(super) ack_p99_late_ms: f64,
    /// The services' resident memory together (the nats-server's apart:
    /// its block cache follows the stream, not the services).
    pub(super) rss_early_mb: f64,
    pub(super) rss_late_mb: f64,
    pub(super) nats_rss_early_mb: f64,
    pub(super) nats_rss_late_mb: f64,
    /// The late p99 and services' memory within 10% of (or below) the early ones.
    pub(super) flat: bool,
}

#[derive(Debug, serde::Serialize)]
pub(super) struct Report {
    pub(super) rate: f64,
    pub(super) explore_every: usize,
    pub(super) projects: usize,
    pub(super) streams: usize,
    pub(super) minutes: Vec<Minute>,
    pub(super) stream_items_received: u64,
    pub(super) streams_opened: u64,
    pub(super) invariants: Invariants,
    pub(super) flatness: Option<Flatness>,
    pub(super) baseline: Baseline,
    pub(super) logs: String,
}

/// What the run gathered besides the turns and the viewers.
pub(super) struct Gathered {
    pub(super) sent: usize,
    pub(super) samples: Vec<Sample>,
    pub(super) deaths: Vec<(String, usize)>,
    pub(super) audit: zopu_runtime::audit::Report,
    pub(super) baseline: Baseline,
    pub(super) logs: std::path::PathBuf,
}

pub(super) fn report(
    args: &SoakArgs,
    turns: &Turns,
    viewers: &Viewers,
    gathered: Gathered,
) -> Report {
    let Gathered {
        sent,
        samples,
        deaths,
        audit,
        baseline,
        logs,
    } = gathered;
    let turns = turns
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let ours: Vec<&Turn> = turns
        .values()
        .filter(|turn| turn.minute.is_some())
        .collect();
    let mut latencies: Vec<Vec<f64>> = vec![Vec::new(); samples.len().max(1) + 1];
    let mut ended_in: Vec<usize> = vec![0; latencies.len()];
    let mut sent_in: Vec<usize> = vec![0; latencies.len()];
    for turn in &ours {
        let minute = turn.minute.unwrap_or(0).min(latencies.len() - 1);
        sent_in[minute] += 1;
        ended_in[minute] += usize::from(turn.ended());
        if let (Some(sent), Some(replied)) = (turn.sent_at, turn.replied_at) {
            latencies[minute].push((replied - sent).as_seconds_f64() * 1000.0);
        }
    }
    let minutes: Vec<Minute> = samples
        .into_iter()
        .enumerate()
        .map(|(index, (usage, streams_open, restarted))| {
            let mut of_minute = std::mem::take(&mut latencies[index]);
            of_minute.sort_by(f64::total_cmp);
            let at = |p| (!of_minute.is_empty()).then(|| percentile(&of_minute, p));
            Minute {
                minute: index + 1,
                sent: sent_in[index],
                ended: ended_in[index],
                ack_p50_ms: at(0.50),
                ack_p99_ms: at(0.99),
                total_rss_mb: usage.iter().map(|u| u.rss_mb).sum(),
                usage,
                streams_open,
                restarted,
            }
        })
        .collect();
    let revocation_close_max_ms = viewers
        .revocation_closes
        .iter()
        .map(|took| took.as_secs_f64() * 1000.0)
        .fold(0.0, f64::max);
    let mut invariants = Invariants {
        messages_sent: sent,
        messages_stored: ours.iter().filter(|turn| turn.stored > 0).count(),
        messages_stored_twice: ours.iter().filter(|turn| turn.stored > 1).count(),
        replied: ours.iter().filter(|turn| turn.replied_at.is_some()).count(),
        acknowledged_twice: ours.iter().filter(|turn| turn.acknowledged > 1).count(),
        turns_ended: ours.iter().filter(|turn| turn.ended()).count(),
        turns_ended_twice: ours.iter().filter(|turn| turn.ended_twice()).count(),
        turns_not_ended: ours.iter().filter(|turn| !turn.ended()).count(),
        revocations: viewers.revocation_closes.len(),
        revocation_close_max_ms,
        streams_left_open: viewers.left_open,
        services_died: deaths,
        audit_clean: audit.is_clean(),
        audit_findings: audit.findings.len(),
        events_audited: audit.events,
        holds: false,
    };
    invariants.holds = invariants.messages_stored == sent
        && invariants.messages_stored_twice == 0
        && invariants.replied == sent
        && invariants.acknowledged_twice == 0
        && invariants.turns_ended == sent
        && invariants.turns_ended_twice == 0
        && invariants.streams_left_open == 0
        && invariants.services_died.is_empty()
        && invariants.audit_clean;
    let flatness = flatness(&minutes);
    Report {
        rate: args.rate,
        explore_every: args.explore_every,
        projects: args.projects,
        streams: args.streams,
        minutes,
        stream_items_received: viewers
            .seen
            .items
            .load(std::sync::atomic::Ordering::Relaxed),
        streams_opened: viewers
            .seen
            .opened
            .load(std::sync::atomic::Ordering::Relaxed),
        invariants,
        flatness,
        baseline,
        logs: logs.display().to_string(),
    }
}

/// The late window against the early one: minutes 5–15 vs the last 10 once
/// there are 25, otherwise the second third vs the last third.
fn flatness(minutes: &[Minute]) -> Option<Flatness> {
    let n = minutes.len();
    if n < 3 {
        return None;
    }
    let (early, late) = if n >= 25 {
        ((5, 15), (n - 9, n))
    } else {
        ((n / 3 + 1, 2 * n / 3), (2 * n / 3 + 1, n))
    };
    let mean = |(from, to): (usize, usize), figure: &dyn Fn(&Minute) -> Option<f64>| {
        let values: Vec<f64> = minutes[from - 1..to].iter().filter_map(figure).collect();
        values.iter().sum::<f64>() / values.len().max(1) as f64
    };
    let p99 = |minute: &Minute| minute.ack_p99_ms;
    let rss_of = |nats: bool| {
        move |minute: &Minute| {
            Some(
                minute
                    .usage
                    .iter()
                    .filter(|usage| (usage.service == NATS_SERVER) == nats)
                    .map(|usage| usage.rss_mb)
                    .sum(),
            )
        }
    };
    let (services, nats) = (rss_of(false), rss_of(true));
    let (ack_p99_early_ms, ack_p99_late_ms) = (mean(early, &p99), mean(late, &p99));
    let (rss_early_mb, rss_late_mb) = (mean(early, &services), mean(late, &services));
    let (nats_rss_early_mb, nats_rss_late_mb) = (mean(early, &nats), mean(late, &nats));
    Some(Flatness {
        early,
        late,
        flat: ack_p99_late_ms <= ack_p99_early_ms * 1.1 && rss_late_mb <= rss_early_mb * 1.1,
        ack_p99_early_ms,
        ack_p99_late_ms,
        rss_early_mb,
        rss_late_mb,
        nats_rss_early_mb,
        nats_rss_late_mb,
    })
}

pub(super) fn print(report: &Report) {
    println!(
        "soak: {:.0} messages/s offered across {} projects (every {} an exploration), {} live streams, one service restarted every period",
        report.rate, report.projects, report.explore_every, report.streams
    );
    let services: Vec<String> = report
        .minutes
        .first()
        .map(|minute| minute.usage.iter().map(|u| u.service.clone()).collect())
        .unwrap_or_default();
    println!(
        "  min   sent  ended  1st reply p50 ms  p99 ms  streams  RSS MB (all) | {} (RSS MB / fds / CPU % of a core)  restarted",
        services.join(" | ")
    );
    let ms = |value: Option<f64>| value.map_or("-".to_owned(), |v| format!("{v:.1}"));
    for minute in &report.minutes {
        let per_service: Vec<String> = minute
            .usage
            .iter()
            .map(|u| format!("{:.0}/{}/{:.0}%", u.rss_mb, u.open_fds, u.cpu_percent))
            .collect();
        println!(
            "  {:>3} {:>6} {:>6} {:>17} {:>7} {:>8} {:>13.0} | {}  {}",
            minute.minute,
            minute.sent,
            minute.ended,
            ms(minute.ack_p50_ms),
            ms(minute.ack_p99_ms),
            minute.streams_open,
            minute.total_rss_mb,
            per_service.join(" | "),
            minute.restarted.join(", ")
        );
    }
    let i = &report.invariants;
    println!(
        "  invariants ({}): {} sent, {} stored ({} twice), {} replied to ({} acknowledged twice), {} ended ({} a dispatch twice, {} not)",
        if i.holds { "hold" } else { "BROKEN" },
        i.messages_sent,
        i.messages_stored,
        i.messages_stored_twice,
        i.replied,
        i.acknowledged_twice,
        i.turns_ended,
        i.turns_ended_twice,
        i.turns_not_ended
    );
    println!(
        "    {} revocations, slowest end of a revoked token's streams {:.0} ms (budget {} ms), {} left open; services died on their own: {:?}",
        i.revocations,
        i.revocation_close_max_ms,
        REVOCATION_BUDGET.as_millis(),
        i.streams_left_open,
        i.services_died
    );
    println!(
        "    audit verify over {} events: {} ({} findings); {} timeline items over {} stream openings",
        i.events_audited,
        if i.audit_clean { "clean" } else { "NOT clean" },
        i.audit_findings,
        report.stream_items_received,
        report.streams_opened
    );
    if let Some(flat) = &report.flatness {
        println!(
            "  flatness (minutes {}-{} vs {}-{}): first-reply p99 {:.1} -> {:.1} ms, the services' resident memory {:.0} -> {:.0} MB: {} (target: late within 10%); the nats-server's {:.0} -> {:.0} MB",
            flat.early.0,
            flat.early.1,
            flat.late.0,
            flat.late.1,
            flat.ack_p99_early_ms,
            flat.ack_p99_late_ms,
            flat.rss_early_mb,
            flat.rss_late_mb,
            if flat.flat { "flat" } else { "NOT flat" },
            flat.nats_rss_early_mb,
            flat.nats_rss_late_mb
        );
    }
    let b = &report.baseline;
    let p99s: Vec<f64> = report.minutes.iter().filter_map(|m| m.ack_p99_ms).collect();
    let median_p99 = {
        let mut sorted = p99s.clone();
        sorted.sort_by(f64::total_cmp);
        (!sorted.is_empty()).then(|| percentile(&sorted, 0.5))
    };
    println!(
        "  raw JetStream append at the soak's write rate ({:.0} events/s; contract headers + project expectation, no client work): p50 {:.2} ms, p99 {:.2} ms{}",
        b.write_rate_per_s,
        b.raw_append_p50_ms,
        b.raw_append_p99_ms,
        median_p99
            .map(|p99| format!(
                "; the median minute's acknowledgement p99 = {:.1}x one raw append's",
                p99 / b.raw_append_p99_ms
            ))
            .unwrap_or_default()
    );
    println!("  service logs: {}", report.logs);
}
