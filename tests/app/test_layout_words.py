"""Layout from 900 to 1920 px, human units on the charts, legends outside the lines, words for people."""
from app_helpers import make_window
from app.views.panels import LivePanels


def test_the_window_with_panels_fits_900_px_and_grows_to_1920(qtbot, data_dir):
    window = make_window(qtbot, data_dir)
    window.panels_action.setChecked(True)
    assert window.minimumSizeHint().width() <= 900
    for width in (900, 1920):
        window.resize(width, 700)
        qtbot.wait(50)
        assert window.chat_view.width() >= 300                     # the chat column stays readable
    assert window.shutdown()


def test_chart_axes_use_human_units_and_legends_sit_in_the_titles(qtbot):
    snapshots = iter([{"disk": {"bytes_read": 0}}, {"disk": {"bytes_read": 8_000}}])
    panels = LivePanels(lambda: next(snapshots, {"disk": {"bytes_read": 8_000}}))
    qtbot.addWidget(panels)
    panels.show()
    panels.history.push({"disk": {"bytes_read": 0}}, 0.0)
    panels.history.push({"disk": {"bytes_read": 8_000}}, 0.1)        # 80 kB/s, 8e-05 GB/s
    panels._update_plots()
    qtbot.wait(50)                                                   # the view range follows the data
    axis = panels.disk_plot.getAxis("left")
    assert "kB/s" in axis.labelString()                              # "80 kB/s", not "8e-05"
    assert panels.disk_plot.getPlotItem().legend is None               # no legend box over the lines
    title = panels.disk_plot.getPlotItem().titleLabel.text
    assert "engine" in title and "system (dashed)" in title
    assert "roofline" not in panels.speed_label.toolTip() and "fastest" in panels.speed_label.toolTip()
    assert all("/s" in plot.getAxis("left").labelString() for plot in (panels.h2d_plot, panels.tok_plot))  # a unit


def test_the_speed_charts_axes_start_at_0(qtbot):
    panels = LivePanels(lambda: {})
    qtbot.addWidget(panels)
    panels.show()
    for i, tok_s in enumerate((18.9, 18.7, 17.6, 18.8)):            # a steady decode with a small dip
        panels.history.push({"speed": {"decode_tok_s": tok_s, "prefill_tok_s": 21.0},
                             "disk": {"bytes_read": 50_000_000 + i * 1_000_000}}, i * 0.1)
    panels._update_plots()
    qtbot.wait(50)
    for plot in (panels.tok_plot, panels.disk_plot, panels.h2d_plot):
        low, high = plot.getViewBox().viewRange()[1]
        assert low == 0 and high > 0
    assert 21 <= panels.tok_plot.getViewBox().viewRange()[1][1] < 24                # the top just above the values


def test_each_small_chart_labels_its_axis_one_to_three_steps_apart(qtbot):
    panels = LivePanels(lambda: {})
    qtbot.addWidget(panels)
    panels.show()
    for i, tok_s in enumerate((187.0, 190.5, 244.2)):
        panels.history.push({"speed": {"decode_tok_s": tok_s, "prefill_tok_s": 6060.0},
                             "disk": {"bytes_read": i * 37_000_000}}, i * 0.1)
    panels._update_plots()
    qtbot.wait(50)
    for plot in (panels.hit_plot, panels.tok_plot, panels.disk_plot, panels.h2d_plot):
        axis, (low, high) = plot.getAxis("left"), plot.getViewBox().viewRange()[1]
        labels = [v for _, values in axis.tickValues(low, high, axis.height()) for v in values]
        assert 2 <= len(set(labels)) <= 4, (plot, labels)            # 0 and one to three more, none touching


def test_while_the_engine_works_the_plots_take_turns_and_each_moves_2_5_times_a_second(qtbot):
    reads = iter(range(0, 10**9, 4_000_000))
    panels = LivePanels(lambda: {"disk": {"bytes_read": next(reads)}, "speed": {"decode_tok_s": 5.0},
                                 "ram_cache": {"hits": 3, "misses": 1}, "h2d": {"bytes": next(reads)}})
    qtbot.addWidget(panels)
    panels.show()
    plots = {"hit": panels.hit_curves.values(), "disk": panels.disk_curves.values(),
             "h2d": panels.h2d_curves.values(), "tok": panels.tok_curves.values()}
    moved = []
    for name, curves in plots.items():
        for curve in curves:
            curve.sigPlotChanged.connect(lambda *_a, name=name: moved.append(name))
    panels.set_busy(True)
    per_refresh = []
    for _ in range(8):                                   # 0.8 s of refreshes at 10 Hz
        moved.clear()
        panels.refresh()
        per_refresh.append(set(moved))
    assert all(len(names) == 1 for names in per_refresh)             # one plot painted per refresh
    assert all(sum(names == {name} for names in per_refresh) == 2 for name in plots)   # each plot twice in 0.8 s
    assert panels.disk_curves["engine"].getData()[1][-1] > 0           # with the latest figures
    moved.clear()
    panels.set_busy(False)                                             # idle: one refresh moves them all
    assert set(moved) == set(plots)
    moved.clear()
    panels.refresh()                                                   # then, at 1 Hz, one plot a tick again
    assert len(set(moved)) == 1


def test_the_ram_cache_line_says_how_many_blocks_were_filled_ahead_and_nothing_before(qtbot):
    snapshot = {"ram_cache": {"hits": 3, "misses": 1, "evictions": 0, "used_bytes": 4, "capacity_bytes": 8}}
    panels = LivePanels(lambda: snapshot)
    qtbot.addWidget(panels)
    panels.refresh()
    assert "filled ahead" not in panels.cache_label.text()
    snapshot["ram_cache"]["fill_reads"] = 12
    panels.refresh()
    assert panels.cache_label.text().endswith("· 12 filled ahead")
