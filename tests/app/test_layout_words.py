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
