//! The streaming path against a stand-in upstream on loopback (no model provider is reached):
//! the upstream's bytes reach the client before the event they begin is whole, usage is read
//! from the same bytes, and an upstream that dies inside an event ends the stream with an
//! `error` event that reads as one.

use axum::body::{Body, Bytes};
use axum::http::HeaderMap;
use cella_gateway::{
    Api, BoxFuture, Caller, Gateway, GatewayConfig, Meter, Metered, Refusal, UpstreamKind,
};
use futures_util::StreamExt;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// Admits everything, keeps what is recorded.
#[derive(Default)]
struct Recorder(Mutex<Vec<Metered>>);

impl Meter for Recorder {
    fn admit<'a>(
        &'a self,
        _: &'a Caller,
        _: &'a str,
        _: Option<cella_types::Money>,
    ) -> BoxFuture<'a, Result<cella_gateway::Hold, Refusal>> {
        Box::pin(async { Ok(cella_gateway::Hold::none()) })
    }
    fn record(&self, _: Caller, m: Metered) -> BoxFuture<'static, ()> {
        self.0.lock().unwrap().push(m);
        Box::pin(async {})
    }
}

/// An upstream whose one streamed answer is what the test sends on the channel, piece by piece
/// (an `Err` breaks the connection off).
async fn upstream(pieces: mpsc::UnboundedReceiver<Result<&'static str, ()>>) -> String {
    let pieces = Arc::new(tokio::sync::Mutex::new(Some(pieces)));
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move || {
            let pieces = pieces.clone();
            async move {
                let rx = pieces.lock().await.take().expect("one request");
                let s = futures_util::stream::unfold(rx, |mut rx| async move {
                    match rx.recv().await? {
                        Ok(p) => Some((Ok::<_, std::io::Error>(Bytes::from(p)), rx)),
                        Err(()) => Some((Err(std::io::Error::other("cut")), rx)),
                    }
                });
                (
                    [("content-type", "text/event-stream")],
                    Body::from_stream(s),
                )
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    url
}

fn gateway(base_url: String) -> Gateway {
    let mut c = GatewayConfig::default();
    c.upstreams.push(cella_gateway::config::UpstreamConfig {
        name: "standin".into(),
        kind: UpstreamKind::Openai,
        base_url,
        api_key_env: None,
        api_key: None,
        models: vec!["m".into()],
    });
    c.prices.insert(
        "m".into(),
        cella_gateway::Price {
            input: "1".parse().unwrap(),
            output: "2".parse().unwrap(),
        },
    );
    Gateway::with_env(&c, |_| None).unwrap()
}

async fn start(
    gw: &Gateway,
    meter: Arc<Recorder>,
) -> impl futures_util::Stream<Item = Result<Bytes, axum::Error>> {
    let caller = Caller {
        workspace_id: "ws1".into(),
        sandbox_id: None,
        request_id: "gwr1".into(),
    };
    let body = Body::from(r#"{"model":"m","stream":true,"messages":[]}"#);
    let res = gw
        .handle(
            Api::ChatCompletions,
            caller,
            meter,
            &HeaderMap::new(),
            None,
            body,
        )
        .await;
    assert_eq!(res.status(), 200);
    res.into_body().into_data_stream()
}

#[tokio::test]
async fn bytes_go_out_before_their_event_is_whole_and_usage_is_read_on_the_side() {
    let (tx, rx) = mpsc::unbounded_channel();
    let gw = gateway(upstream(rx).await);
    let meter = Arc::new(Recorder::default());
    tx.send(Ok("data: {\"choices\":[{\"delta\":")).unwrap();
    let mut body = start(&gw, meter.clone()).await;
    // Half an event: the client has it while the upstream has sent nothing more.
    let first = body.next().await.unwrap().unwrap();
    assert_eq!(&first[..], b"data: {\"choices\":[{\"delta\":");
    tx.send(Ok(
        "{\"content\":\"Hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_",
    ))
    .unwrap();
    tx.send(Ok(
        "tokens\":10,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n",
    ))
    .unwrap();
    drop(tx);
    let mut all = first.to_vec();
    while let Some(c) = body.next().await {
        all.extend_from_slice(&c.unwrap());
    }
    assert_eq!(
        String::from_utf8(all).unwrap(),
        "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n"
    );
    drop(body);
    let got = meter.0.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].usage.input_tokens, 10);
    assert_eq!(got[0].usage.output_tokens, 3);
    // 10 × 1 + 3 × 2 per million tokens: 16 micro-units.
    assert_eq!(got[0].cost.micros(), 16);
    assert!(got[0].complete);
}

#[tokio::test]
async fn an_upstream_that_dies_inside_an_event_ends_with_an_error_event_of_its_own() {
    let (tx, rx) = mpsc::unbounded_channel();
    let gw = gateway(upstream(rx).await);
    let meter = Arc::new(Recorder::default());
    tx.send(Ok("data: {\"choices\":[]}\n\ndata: {\"cho"))
        .unwrap();
    let mut body = start(&gw, meter.clone()).await;
    let first = body.next().await.unwrap().unwrap();
    assert_eq!(&first[..], b"data: {\"choices\":[]}\n\ndata: {\"cho");
    tx.send(Err(())).unwrap();
    let mut rest = Vec::new();
    while let Some(c) = body.next().await {
        rest.extend_from_slice(&c.unwrap());
    }
    let rest = String::from_utf8(rest).unwrap();
    // The cut event is ended, then the error is an event of its own.
    assert!(rest.starts_with("\n\nevent: error\ndata: {"), "{rest:?}");
    assert!(rest.ends_with("\n\n"));
    let data = rest.trim().split_once("data: ").unwrap().1;
    let v: serde_json::Value = serde_json::from_str(data).unwrap();
    assert_eq!(v["error"]["code"], "upstream_unavailable");
}
