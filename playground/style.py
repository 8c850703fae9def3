"""The page's CSS and the little JavaScript it needs (Enter submits the prompt; the queue-full toast
is hidden because the status line says it)."""

CSS = """
/* Gradio prefixes every rule inside @media with ".gradio-container .contain": such rules anchor on
   our own elements (#play-top, #tab-playground), never on body. */
/* WCAG 2 AA contrast (axe-core): Gradio's orange primary, tab, slider-range and footer greys are below 4.5:1 */
.gradio-container {--button-primary-background-fill: #c2410c; --button-primary-background-fill-hover: #9a3412;
  --button-primary-text-color: #fff; --button-primary-border-color: #c2410c;}
[role=tab].selected {color: #9a3412 !important;}
.min_value, .max_value {color: #555 !important;}
footer, footer a, footer button, .built-with, .show-api, .settings, .run-history {color: #555 !important;}
.scope {font-size: 15px; line-height: 1.45; padding: 10px 14px; border-radius: 8px; background: #eef4ff;
  color: #111; border: 1px solid #b9cdf5;}
.scope ul {margin: 4px 0 6px 18px; padding: 0;}
.scope code {background: #fff; color: #111; padding: 0 3px;}
.scope details {margin-top: 4px;}
.scope summary {cursor: pointer; color: #1e3a8a; text-decoration: underline;}
.run-status {font-size: 14px; padding: 4px 2px; min-height: 1.5em; color: #222;}
.run-status[data-kind=error] {color: #a40000; font-weight: 600;}
.run-status[data-kind=rejected], .run-status[data-kind=stopped], .run-status[data-kind=cancelled] {color: #7a3d00;
  font-weight: 600;}
.run-status[data-kind=done] {color: #0a5a24;}
/* A run refused by a full queue fails with no output: Gradio marks every output "Error". The status
   line says what happened (playground.runs), once. */
[data-testid=status-tracker]:has(> .error) {display: none !important;}
.prompt-info {font-size: 13px; color: #333;}
.prompt-info[data-kind=error] {color: #a40000; font-weight: 600;}
.mars-panel {font-size: 15px;}
.mars-panel .head {margin-bottom: 4px;}
.mars-panel .model {color: #444; font-family: monospace;}
.mars-panel .status {float: right; font-size: 13px; padding: 1px 8px; border-radius: 8px; background: #e5e5e5; color: #111;}
.mars-panel[data-status=running] .status {background: #fde68a;}
.mars-panel[data-status=done] .status, .mars-panel[data-status=limit] .status {background: #bbf7d0;}
.mars-panel[data-status=limit] .status {background: #fed7aa;}
.mars-panel .counters {display: flex; flex-wrap: wrap; gap: 4px 12px; font-size: 13px; margin-bottom: 6px; color: #222;}
.mars-panel .text {white-space: pre-wrap; overflow-wrap: anywhere; word-break: normal; font-family: monospace;
  line-height: 1.7; min-height: 120px; max-height: 420px; overflow-y: auto; border: 1px solid #bbb; border-radius: 6px;
  padding: 6px; background: #fff; color: #111;}
.mars-panel .tok {border-radius: 3px; padding: 0 1px; position: relative; cursor: pointer;}
.mars-panel .tok:focus {outline: 2px solid #1d4ed8; outline-offset: 1px;}
.mars-panel .tok.verified {text-decoration: underline double; text-underline-offset: 3px;
  text-decoration-color: #111;}  /* drawn below the shade, on the page: dark even under white text */
.legend .legend-verified {cursor: default; padding: 0;}
.mars-panel .tok:focus::after {content: attr(data-tip); position: absolute; left: 0; top: 1.7em; z-index: 10;
  background: #111; color: #fff; padding: 4px 8px; border-radius: 4px; font-size: 13px; white-space: normal;
  width: max-content; max-width: 240px; font-family: sans-serif;}
.mars-panel .note {font-size: 13px; color: #8a4b00;}
.legend {font-size: 13px; color: #333; margin-top: 4px; line-height: 1.6;}
.legend .leg {margin: 0 4px; white-space: nowrap;}
.legend .chip {display: inline-block; width: 11px; height: 11px; margin-right: 1px; border: 1px solid #777;}
.muted {color: #555; font-size: 13px;}
.mode-line {margin-top: -4px;}
.train-progress {margin: 4px 0;}
.train-progress .tp-track {background: #eee; height: 14px; border-radius: 7px; overflow: hidden;}
.train-progress .tp-bar {display: block; height: 100%; background: hsl(212, 85%, 45%); transition: width 0.3s;}
.train-progress .tp-text {font-size: 14px; color: #222; margin-top: 4px;}
table.train-evals caption {text-align: left; font-size: 13px; color: #333;}
table.train-evals td, table.train-evals th {white-space: nowrap; padding: 2px 8px;}
.compare {font-size: 15px; padding: 4px;}
.speed {font-size: 14px; padding: 6px 2px; color: #111;}
.speed .sp-title {margin-bottom: 4px;}
.speed .sp-row {display: flex; align-items: center; gap: 8px; margin: 2px 0;}
.speed .sp-lbl {width: 48px; font-weight: 600;}
.speed .sp-track {flex: 1; background: #eee; height: 14px; border-radius: 7px; overflow: hidden;}
.speed .sp-bar {display: block; height: 100%; border-radius: 7px;}
.speed .sp-bar.mars {background: hsl(212, 85%, 45%);}
.speed .sp-bar.ar {background: hsl(28, 85%, 50%);}
.speed .sp-val {width: 110px; text-align: right; font-variant-numeric: tabular-nums;}
.replay {font-size: 14px; color: #111;}
.replay-head {margin: 4px 0;}
.replay-in {font-family: monospace; background: #fff; border: 1px solid #bbb; border-radius: 6px; padding: 6px;
  margin: 6px 0; overflow-wrap: anywhere; white-space: pre-wrap;}
.replay-in .lbl {font-family: sans-serif; font-weight: 600;}
.replay .mask-chip {display: inline-block; background: #444; color: #fff; border-radius: 3px; padding: 0 4px; margin: 0 2px;}
.replay-table {border-collapse: collapse; width: 100%; font-size: 14px;}
.replay-table caption {text-align: left; font-weight: 600; padding: 4px 0;}
.replay-table th, .replay-table td {border-bottom: 1px solid #ccc; padding: 4px 6px; text-align: left; vertical-align: top;}
.replay-table tr[data-mark=accepted] .mark {color: #0a6b2b; font-weight: 600;}
.replay-table tr[data-mark=rejected] .mark {color: #a40000; font-weight: 600;}
.replay-table tr[data-mark=rejected] code {text-decoration: line-through;}
.replay-table tr[data-mark=end] .mark {color: #333; font-weight: 600;}
@media (max-width: 640px) {
  /* result tables: one row per line, scrolled sideways (style.JS makes each focusable), never a
     column one letter wide */
  /* while a run plays (Stop is enabled) the live tau slider rides at the bottom of the screen, so
     that it can be moved while watching the panels; its place in the settings is kept */
  #play-top:has(#stop:enabled) #tau {min-height: 103px;}
  #play-top:has(#stop:enabled) #tau > .wrap:not([data-testid]) {position: fixed; left: 0; right: 0; bottom: 0; z-index: 60;
    background: #fff; padding: 4px 12px 8px; border-top: 2px solid #c2410c; box-shadow: 0 -2px 8px rgba(0,0,0,.15);}
  #tab-playground:has(#stop:enabled) {padding-bottom: 110px;}
  /* and Stop floats just above it (its place next to Generate is screens up by then) */
  #play-top:has(#stop:enabled) #stop {position: fixed; right: 12px; bottom: 112px; z-index: 61; width: auto;
    min-width: 96px; box-shadow: 0 2px 8px rgba(0,0,0,.25);}
  .prose table:not(.replay-table) {display: block; overflow-x: auto; max-width: 100%; border: 0;}
  .prose table:not(.replay-table) :is(th, td) {white-space: nowrap; word-break: normal; overflow-wrap: normal;}
  .replay-table thead {display: none;}
  .replay-table tr {display: block; border-bottom: 1px solid #ccc; padding: 4px 0;}
  .replay-table td {display: inline-block; border: none; padding: 2px 4px;}
  .replay-table td:last-child {display: block;}
  .speed .sp-val {width: 90px;}
}
"""

# Chat demos submit on Enter and keep Shift+Enter for a new line; Gradio's multi-line textbox
# does it the other way round. Both keys are taken here, before Gradio sees them.
JS = """() => {
  // Gradio toasts "currently busy" when its queue is full; the run's status line says it in place
  // (playground.runs.settle), so the toast would say it twice.
  new MutationObserver(() => {
    document.querySelectorAll('.toast-body.error').forEach((t) => {
      if (t.innerText.includes('currently busy')) t.closest('.toast-item').style.display = 'none';
    });
    // a table wider than a phone scrolls sideways: keyboard users must be able to reach it
    document.querySelectorAll('.prose table:not([tabindex]):not(.replay-table)').forEach((t) => {
      t.tabIndex = 0;
      t.setAttribute('aria-label', 'results table (scrolls sideways on a narrow screen)');
    });
  }).observe(document.body, {childList: true, subtree: true});
  document.addEventListener('keydown', (e) => {
    const box = e.target.closest && e.target.closest('#prompt');
    if (!box || e.key !== 'Enter' || e.isComposing) return;
    e.preventDefault();
    e.stopPropagation();
    if (e.shiftKey) {
      document.execCommand('insertText', false, '\\n');
    } else {
      e.target.dispatchEvent(new Event('input', {bubbles: true}));
      document.getElementById('generate')?.click();
    }
  }, true);
}"""
