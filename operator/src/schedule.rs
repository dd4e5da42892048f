//! Cron schedules as upstream parses them (robfig/cron's standard parser): five fields —
//! minute, hour, day of month, month, day of week — or a descriptor (`@hourly`, `@daily`,
//! `@midnight`, `@weekly`, `@monthly`, `@yearly`, `@annually`, `@every <duration>`). Times are
//! UTC seconds since the epoch; UTC has no daylight-saving jumps, so plain arithmetic is exact.

/// Why a schedule could not be parsed; the message names the part at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("schedule {schedule:?}: {why}")]
pub struct ScheduleError {
    pub schedule: String,
    pub why: Problem,
}

/// What is wrong with a schedule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("time zones are not supported; schedules run in UTC")]
    TimeZone,
    #[error(transparent)]
    Every(#[from] go_flags::GoValueError),
    #[error("unknown descriptor {0:?}")]
    Descriptor(String),
    #[error("expected 5 fields (minute hour day-of-month month day-of-week), got {0}")]
    FieldCount(usize),
    #[error("{field}: {why}")]
    Field { field: &'static str, why: FieldProblem },
}

/// What is wrong with one field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldProblem {
    #[error("{0:?} is not a number")]
    NotANumber(String),
    #[error("{value} is outside {min}-{max}")]
    OutOfRange { value: u32, min: u32, max: u32 },
    #[error("step {0:?} is not a number")]
    Step(String),
    #[error("a step of 0")]
    ZeroStep,
    #[error("range {0:?} runs backwards")]
    Backwards(String),
}

/// A parsed schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Schedule {
    /// Fields as bit sets (bit n set = value n allowed).
    Cron { minutes: u64, hours: u64, days: u64, months: u64, weekdays: u64, days_star: bool, weekdays_star: bool },
    /// `@every <duration>`, in whole seconds (at least 1).
    Every(u64),
}

struct Field {
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const MINUTE: Field = Field { min: 0, max: 59, names: &[] };
const HOUR: Field = Field { min: 0, max: 23, names: &[] };
const DAY: Field = Field { min: 1, max: 31, names: &[] };
const MONTH: Field = Field {
    min: 1,
    max: 12,
    names: &["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"],
};
const WEEKDAY: Field = Field { min: 0, max: 6, names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"] };

impl Field {
    fn value(&self, text: &str) -> Result<u32, FieldProblem> {
        let lower = text.to_ascii_lowercase();
        // Names are at most twelve: their index fits.
        if let Some(i) = self.names.iter().position(|n| *n == lower).and_then(|i| u32::try_from(i).ok()) {
            return Ok(self.min + i);
        }
        let n: u32 = text.parse().map_err(|_| FieldProblem::NotANumber(text.to_owned()))?;
        // Day of week 7 is Sunday, as in most crons.
        let n = if self.max == 6 && n == 7 { 0 } else { n };
        if n < self.min || n > self.max {
            return Err(FieldProblem::OutOfRange { value: n, min: self.min, max: self.max });
        }
        Ok(n)
    }

    /// A comma list of `*`, `?`, `a`, `a-b`, each with an optional `/step`. Returns the bit set
    /// and whether the field was a bare `*` (or `?`).
    fn parse(&self, text: &str) -> Result<(u64, bool), FieldProblem> {
        let mut bits = 0u64;
        let star = text == "*" || text == "?";
        for item in text.split(',') {
            let (range, step) = match item.split_once('/') {
                Some((r, s)) => {
                    let step: u32 = s.parse().map_err(|_| FieldProblem::Step(s.to_owned()))?;
                    if step == 0 {
                        return Err(FieldProblem::ZeroStep);
                    }
                    (r, Some(step))
                }
                None => (item, None),
            };
            let (low, high) = match range {
                "*" | "?" => (self.min, self.max),
                _ => match range.split_once('-') {
                    Some((a, b)) => (self.value(a)?, self.value(b)?),
                    // `a/step` runs from a to the end, as robfig's parser reads it.
                    None if step.is_some() => (self.value(range)?, self.max),
                    None => {
                        let v = self.value(range)?;
                        (v, v)
                    }
                },
            };
            if low > high {
                return Err(FieldProblem::Backwards(range.to_owned()));
            }
            let step = step.unwrap_or(1);
            let mut v = low;
            while v <= high {
                bits |= 1 << v;
                v += step;
            }
        }
        Ok((bits, star))
    }
}

impl Schedule {
    pub fn parse(text: &str) -> Result<Schedule, ScheduleError> {
        let error = |why: Problem| ScheduleError { schedule: text.to_owned(), why };
        let trimmed = text.trim();
        if trimmed.starts_with("TZ=") || trimmed.starts_with("CRON_TZ=") {
            return Err(error(Problem::TimeZone));
        }
        if let Some(duration) = trimmed.strip_prefix("@every ") {
            let d = go_flags::parse_go_duration(duration.trim()).map_err(|e| error(e.into()))?;
            // As robfig: at least one second, whole seconds.
            return Ok(Schedule::Every(d.as_secs().max(1)));
        }
        let expanded = match trimmed {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            other if other.starts_with('@') => return Err(error(Problem::Descriptor(other.to_owned()))),
            other => other,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        let [minute, hour, day, month, weekday] = fields[..] else {
            return Err(error(Problem::FieldCount(fields.len())));
        };
        let named = |name: &'static str, field: &Field, text: &str| {
            field.parse(text).map_err(|why| error(Problem::Field { field: name, why }))
        };
        let (minutes, _) = named("minute", &MINUTE, minute)?;
        let (hours, _) = named("hour", &HOUR, hour)?;
        let (days, days_star) = named("day of month", &DAY, day)?;
        let (months, _) = named("month", &MONTH, month)?;
        let (weekdays, weekdays_star) = named("day of week", &WEEKDAY, weekday)?;
        Ok(Schedule::Cron { minutes, hours, days, months, weekdays, days_star, weekdays_star })
    }

    /// The first run strictly after `t` (seconds), or `None` if there is none within ~5 years
    /// (e.g. `0 0 30 2 *`).
    pub fn next_after(&self, t: i64) -> Option<i64> {
        let (minutes, hours, days, months, weekdays, days_star, weekdays_star) = match *self {
            Schedule::Every(secs) => return t.checked_add(i64::try_from(secs).ok()?),
            Schedule::Cron { minutes, hours, days, months, weekdays, days_star, weekdays_star } => {
                (minutes, hours, days, months, weekdays, days_star, weekdays_star)
            }
        };
        let has = |bits: u64, v: i64| (0..64).contains(&v) && bits & (1 << v) != 0;
        let mut minute = t.div_euclid(60) + 1;
        let limit = minute + 5 * 366 * 1440;
        while minute < limit {
            let day_number = minute.div_euclid(1440);
            let of_day = minute.rem_euclid(1440);
            let (_, month, day) = civil_from_days(day_number);
            if !has(months, month) {
                let (y, m, _) = civil_from_days(day_number);
                let (y, m) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                minute = days_from_civil(y, m, 1) * 1440;
                continue;
            }
            // 1970-01-01 was a Thursday (4, with Sunday 0).
            let weekday = (day_number + 4).rem_euclid(7);
            let day_ok = if days_star || weekdays_star {
                has(days, day) && has(weekdays, weekday)
            } else {
                has(days, day) || has(weekdays, weekday)
            };
            if !day_ok {
                minute = (day_number + 1) * 1440;
                continue;
            }
            if !has(hours, of_day / 60) {
                minute = day_number * 1440 + (of_day / 60 + 1) * 60;
                continue;
            }
            if !has(minutes, of_day % 60) {
                minute += 1;
                continue;
            }
            return Some(minute * 60);
        }
        None
    }

    /// The time between two consecutive runs after `t` (for the stagger window).
    pub fn interval_after(&self, t: i64) -> Option<i64> {
        let first = self.next_after(t)?;
        Some(self.next_after(first)? - first)
    }
}

/// (year, month 1–12, day 1–31) of a day number (days since 1970-01-01); Howard Hinnant's
/// `civil_from_days`.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The day number of a civil date (inverse of [`civil_from_days`]).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-11-23T10:17:30Z, a Monday.
    const NOW: i64 = 1_795_429_050;

    fn at(year: i64, month: i64, day: i64, hour: i64, minute: i64) -> i64 {
        days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60
    }

    fn next(schedule: &str, t: i64) -> Option<i64> {
        Schedule::parse(schedule).unwrap().next_after(t)
    }

    #[test]
    fn the_calendar_arithmetic_round_trips() {
        assert_eq!(at(2026, 11, 23, 10, 17) + 30, NOW);
        for day in [-800_000, -1, 0, 59, 60, 11_016, 20_415, 2_000_000] {
            let (y, m, d) = civil_from_days(day);
            assert_eq!(days_from_civil(y, m, d), day);
        }
        assert_eq!(civil_from_days(days_from_civil(2024, 2, 29)), (2024, 2, 29));
    }

    #[test]
    fn fields_descriptors_and_every() {
        assert_eq!(next("*/15 * * * *", NOW), Some(at(2026, 11, 23, 10, 30)));
        assert_eq!(next("0 2 * * *", NOW), Some(at(2026, 11, 24, 2, 0)));
        assert_eq!(next("@hourly", NOW), Some(at(2026, 11, 23, 11, 0)));
        assert_eq!(next("@daily", NOW), Some(at(2026, 11, 24, 0, 0)));
        assert_eq!(next("@midnight", NOW), Some(at(2026, 11, 24, 0, 0)));
        // The next Sunday after Monday 23 November is the 29th.
        assert_eq!(next("@weekly", NOW), Some(at(2026, 11, 29, 0, 0)));
        assert_eq!(next("0 0 * * SUN", NOW), Some(at(2026, 11, 29, 0, 0)));
        assert_eq!(next("0 0 * * 7", NOW), Some(at(2026, 11, 29, 0, 0)));
        assert_eq!(next("@monthly", NOW), Some(at(2026, 12, 1, 0, 0)));
        assert_eq!(next("@yearly", NOW), Some(at(2027, 1, 1, 0, 0)));
        assert_eq!(next("30 4 1-7 JAN,jul mon", NOW), Some(at(2027, 1, 1, 4, 30)), "day OR weekday when both are set");
        assert_eq!(next("0 12 29 2 *", NOW), Some(at(2028, 2, 29, 12, 0)));
        assert_eq!(next("5/20 * * * *", NOW), Some(at(2026, 11, 23, 10, 25)));
        assert_eq!(next("0 0 30 2 *", NOW), None, "30 February never comes");
        assert_eq!(next("@every 5s", NOW), Some(NOW + 5));
        assert_eq!(next("@every 1h30m", NOW), Some(NOW + 5400));
        assert_eq!(next("@every 10ms", NOW), Some(NOW + 1), "at least a second, as robfig");
        assert_eq!(Schedule::parse("0 */6 * * *").unwrap().interval_after(NOW), Some(6 * 3600));
    }

    #[test]
    fn bad_schedules_say_what_is_wrong() {
        for (schedule, part) in [
            ("* * * *", "expected 5 fields"),
            ("60 * * * *", "minute"),
            ("* 24 * * *", "hour"),
            ("* * 0 * *", "day of month"),
            ("* * * 13 *", "month"),
            ("* * * * funday", "day of week"),
            ("*/0 * * * *", "step of 0"),
            ("5-1 * * * *", "backwards"),
            ("@fortnightly", "unknown descriptor"),
            ("@every soon", "soon"),
            ("CRON_TZ=Europe/Paris 0 0 * * *", "time zones"),
        ] {
            let err = Schedule::parse(schedule).unwrap_err().to_string();
            assert!(err.contains(part), "{schedule:?}: {err}");
        }
    }
}
