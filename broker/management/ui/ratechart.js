// A small live line chart on a <canvas>: a few series of (time, rate) points over
// the last `span` seconds, redrawn on every add. Written for this UI (no library).
"use strict";

class RateChart {
  constructor(canvas, series, span) {
    this.canvas = canvas;
    this.series = series;            // [{key, label, color}]
    this.span = span || 300;         // seconds shown
    this.points = [];                // [{t: seconds, values: {key: rate}}]
  }

  add(t, values) {
    this.points.push({t, values});
    while (this.points.length && this.points[0].t < t - this.span) this.points.shift();
    this.canvas.dataset.points = String(this.points.length);
    this.draw();
  }

  draw() {
    const c = this.canvas, g = c.getContext("2d");
    const w = c.width, h = c.height, left = 50, bottom = 20, top = 10, right = 10;
    g.clearRect(0, 0, w, h);
    g.font = "11px sans-serif";
    let max = 1;
    for (const p of this.points)
      for (const s of this.series) max = Math.max(max, p.values[s.key] || 0);
    max = niceCeiling(max);
    g.strokeStyle = "#ddd"; g.fillStyle = "#555"; g.lineWidth = 1;
    for (let i = 0; i <= 4; i++) {
      const y = top + (h - top - bottom) * (1 - i / 4);
      g.beginPath(); g.moveTo(left, y); g.lineTo(w - right, y); g.stroke();
      g.fillText(String(Math.round(max * i / 4 * 100) / 100) + "/s", 2, y + 4);
    }
    if (!this.points.length) return;
    const now = this.points[this.points.length - 1].t;
    const x = t => left + (w - left - right) * (1 - (now - t) / this.span);
    const y = v => top + (h - top - bottom) * (1 - v / max);
    g.fillText("-" + this.span + " s", left, h - 5);
    g.fillText("now", w - right - 22, h - 5);
    for (const s of this.series) {
      g.strokeStyle = s.color; g.lineWidth = 2; g.beginPath();
      this.points.forEach((p, i) => {
        const px = x(p.t), py = y(p.values[s.key] || 0);
        if (i === 0) g.moveTo(px, py); else g.lineTo(px, py);
      });
      g.stroke();
    }
  }
}

function niceCeiling(v) {
  const step = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (v <= m * step) return m * step;
  return 10 * step;
}
