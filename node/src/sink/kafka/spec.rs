//! `kafka://HOST:PORT[,HOST:PORT...]?topic_prefix=PREFIX[&...]`: which brokers, which topics.

use std::fmt;

/// Events of transactions other than the oldest open one that the source holds in memory
/// before it stops with an error (`max_buffered=`).
pub const DEFAULT_MAX_BUFFERED: usize = 1_000_000;

/// Which topics carry change events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TopicFilter {
    /// Every `PREFIX.*` topic except the transaction topic (Debezium's layout: one topic per
    /// captured table, `PREFIX.SCHEMA.TABLE` or `PREFIX.DATABASE.TABLE`).
    Prefix,
    /// Exactly these topics (`topics=a,b`).
    List(Vec<String>),
    /// Topics whose whole name matches (`topics_regex=...`).
    Regex(String),
}

/// A Kafka source in Debezium's topic layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KafkaSpec {
    /// Bootstrap brokers, `host:port`.
    pub brokers: Vec<String>,
    /// The connector's `topic.prefix`.
    pub topic_prefix: String,
    pub topics: TopicFilter,
    /// The transaction metadata topic (`transaction_topic=`; default `PREFIX.transaction`,
    /// Debezium's `topic.transaction` default).
    pub transaction_topic: String,
    /// See [`DEFAULT_MAX_BUFFERED`].
    pub max_buffered: usize,
}

impl KafkaSpec {
    /// Parses the part after `kafka://`.
    pub fn parse(rest: &str) -> Result<KafkaSpec, String> {
        let err = |why: String| format!("source `kafka://{rest}`: {why}");
        let (hosts, query) = rest.split_once('?').unwrap_or((rest, ""));
        let brokers: Vec<String> = hosts
            .trim_end_matches('/')
            .split(',')
            .map(str::to_owned)
            .collect();
        for b in &brokers {
            match b.rsplit_once(':') {
                Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {}
                _ => return Err(err(format!("broker `{b}` is not HOST:PORT"))),
            }
        }
        let (mut prefix, mut topics, mut txn_topic, mut max_buffered) =
            (None, TopicFilter::Prefix, None, DEFAULT_MAX_BUFFERED);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| err(format!("`{pair}` is not KEY=VALUE")))?;
            match k {
                "topic_prefix" if !v.is_empty() => prefix = Some(v.to_owned()),
                "topics" if !v.is_empty() => {
                    topics = TopicFilter::List(v.split(',').map(str::to_owned).collect())
                }
                "topics_regex" => {
                    regex::Regex::new(&format!("^(?:{v})$"))
                        .map_err(|e| err(format!("topics_regex: {e}")))?;
                    topics = TopicFilter::Regex(v.to_owned());
                }
                "transaction_topic" if !v.is_empty() => txn_topic = Some(v.to_owned()),
                "max_buffered" => {
                    max_buffered =
                        v.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                            err(format!("max_buffered `{v}` is not a count above 0"))
                        })?
                }
                _ => {
                    return Err(err(format!(
                        "unknown or empty parameter `{k}` (expected topic_prefix, topics, \
                         topics_regex, transaction_topic, max_buffered)"
                    )));
                }
            }
        }
        let topic_prefix = prefix.ok_or_else(|| {
            err("topic_prefix=PREFIX is required (the connector's topic.prefix)".into())
        })?;
        Ok(KafkaSpec {
            brokers,
            transaction_topic: txn_topic.unwrap_or_else(|| format!("{topic_prefix}.transaction")),
            topic_prefix,
            topics,
            max_buffered,
        })
    }

    /// Whether `topic` carries change events this source reads.
    pub fn is_data_topic(&self, topic: &str, regex: Option<&regex::Regex>) -> bool {
        if topic == self.transaction_topic {
            return false;
        }
        match &self.topics {
            TopicFilter::Prefix => topic
                .strip_prefix(&self.topic_prefix)
                .and_then(|rest| rest.strip_prefix('.'))
                .is_some_and(|rest| !rest.is_empty()),
            TopicFilter::List(list) => list.iter().any(|t| t == topic),
            TopicFilter::Regex(_) => regex.is_some_and(|r| r.is_match(topic)),
        }
    }

    /// The compiled `topics_regex`, if one was given.
    pub fn regex(&self) -> Option<regex::Regex> {
        match &self.topics {
            TopicFilter::Regex(r) => {
                Some(regex::Regex::new(&format!("^(?:{r})$")).expect("checked"))
            }
            _ => None,
        }
    }

    /// The data collection (`schema.table` or `db.table`) a topic carries, as END's
    /// `data_collections` names it: the name after the prefix, else its last two parts.
    pub fn collection_of<'a>(&self, topic: &'a str) -> &'a str {
        if let Some(rest) = topic
            .strip_prefix(&self.topic_prefix)
            .and_then(|r| r.strip_prefix('.'))
        {
            return rest;
        }
        match topic.rmatch_indices('.').nth(1) {
            Some((i, _)) => &topic[i + 1..],
            None => topic,
        }
    }
}

impl fmt::Display for KafkaSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "kafka://{}?topic_prefix={}",
            self.brokers.join(","),
            self.topic_prefix
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        let s = KafkaSpec::parse("127.0.0.1:9092,h2:9093?topic_prefix=dbserver1").unwrap();
        assert_eq!(s.brokers, ["127.0.0.1:9092", "h2:9093"]);
        assert_eq!(s.transaction_topic, "dbserver1.transaction");
        assert!(s.is_data_topic("dbserver1.public.accounts", None));
        assert!(!s.is_data_topic("dbserver1.transaction", None));
        assert!(!s.is_data_topic("dbserver1", None));
        assert!(!s.is_data_topic("other.public.accounts", None));
        assert_eq!(
            s.collection_of("dbserver1.public.accounts"),
            "public.accounts"
        );
        assert_eq!(
            s.to_string(),
            "kafka://127.0.0.1:9092,h2:9093?topic_prefix=dbserver1"
        );

        let s = KafkaSpec::parse("h:1?topic_prefix=p&topics_regex=p\\.inv\\..*&max_buffered=10")
            .unwrap();
        let r = s.regex();
        assert!(s.is_data_topic("p.inv.orders", r.as_ref()));
        assert!(!s.is_data_topic("p.other.orders", r.as_ref()));
        assert_eq!(s.max_buffered, 10);
        assert_eq!(s.collection_of("x.inv.orders"), "inv.orders");

        let s = KafkaSpec::parse("h:1?topic_prefix=p&topics=a.b.c&transaction_topic=tx").unwrap();
        assert!(s.is_data_topic("a.b.c", None));
        assert!(!s.is_data_topic("p.b.c", None));
        assert_eq!(s.transaction_topic, "tx");
    }

    #[test]
    fn bad_specs_say_why() {
        for (spec, says) in [
            ("h:1", "topic_prefix=PREFIX is required"),
            ("h?topic_prefix=p", "broker `h` is not HOST:PORT"),
            ("h:1?topic_prefix=p&x=1", "unknown or empty parameter `x`"),
            ("h:1?topic_prefix=p&max_buffered=0", "max_buffered `0`"),
            ("h:1?topic_prefix=p&topics_regex=(", "topics_regex"),
            ("h:1?topic_prefix", "is not KEY=VALUE"),
        ] {
            let e = KafkaSpec::parse(spec).unwrap_err();
            assert!(e.contains(says), "{spec}: {e}");
        }
    }
}
